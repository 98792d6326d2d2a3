"""A callback that does nothing on every hook, read-only and mutable alike: what the hooks
themselves cost (``python benchmarks/loop_speed.py --cases mlp mlp_callbacks``)."""


class NoOp:
    def on_fit_start(self, run):
        pass

    def on_epoch_start(self, epoch):
        pass

    def on_log(self, step, metrics):
        pass

    def on_validation_end(self, epoch, metrics):
        pass

    def on_checkpoint(self, path, kind):
        pass

    def on_fit_end(self, status, metrics):
        pass

    def on_exception(self, error):
        pass

    def on_after_backward(self, step):
        pass

    def on_before_optimizer_step(self, step):
        pass

    def on_after_optimizer_step(self, step):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass
