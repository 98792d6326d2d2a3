"""Run folders, stored runs and resume, each as an attacker or a careless user tried it and a
variant of it: hostile stored configs and top-k lists, run names that escape, what a resume
does with a changed config, the monitor's direction, overwritten runs, file modes, quoting,
seeds and the fp16 scaler after a skipped step."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import stat
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    PREDICT,
    QUIET,
    TRAIN,
    error_line,
    read_metrics,
    run_evaluate,
    run_python,
    run_train,
    scalars,
    write_rows,
    write_table,
)

from utils.checkpoint.load import load_checkpoint
from utils.config.monitor import monitor_mode
from utils.config.trust import allowed_builders, check_stored_config
from utils.errors import UserError
from utils.files import remove_stale_temporary_files, save_atomic
from utils.fit.top_k import checked_top_k, own_top_k_file, top_k_name
from utils.system.claim import CLAIM_FILE
from utils.system.seeding import mix_seed

TINY = ("model.hidden_sizes=[16]", "data.batch_size=128")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished 2-epoch run with top-k files, to resume, evaluate and attack."""
    cwd = tmp_path_factory.mktemp("hardening")
    run_train(cwd, *TINY, "trainer.max_epochs=2", "trainer.keep_top_k=2", "run_name=base")
    return cwd


def copy_run(base: Path, cwd: Path, name: str = "base") -> Path:
    shutil.copytree(base / "checkpoints" / "base", cwd / "checkpoints" / name)
    shutil.copytree(base / "runs" / "base", cwd / "runs" / name)
    return cwd / "checkpoints" / name


# --- 1. A stored config is data --------------------------------------------------------------

HOSTILE_CONFIGS = [
    (
        "interpolation",
        {"model": {"dropout": "${oc.create:{_target_: os.system}}"}},
        "model.dropout=.*interpolation",
    ),
    # data.root=${oc.env:DATA} as the record writes it is evaluate.py's to replace or refuse
    # (utils/checkpoint/stored.py data_config); anything more, or elsewhere, is refused here
    ("env read", {"model": {"path": "${oc.env:HOME}"}}, "model.path=.*interpolation"),
    ("env in a path", {"data": {"root": "${oc.env:HOME}/x"}}, "data.root=.*interpolation"),
    (
        "interpolation in a list",
        {"model": {"hidden_sizes": [8, "${oc.decode:'1'}"]}},
        r"model.hidden_sizes\[1\]",
    ),
    ("interpolation in a key", {"model": {"${oc.env:X}": 1}}, "not a plain name"),
    (
        "package prefix",
        {"model": {"_target_": "torch.nn.attention._fa4._fa4_import_module"}},
        "model._target_='torch.nn.attention",
    ),
    (
        "nested target",
        {"model": {"_target_": "models.mlp.mlp", "act": {"_target_": "os.system"}}},
        "model.act._target_='os.system'",
    ),
    (
        "a group's builder where its group holds none",  # a loader inside data.augment
        {
            "data": {
                "_target_": "data.images.digits.load_digits",
                "augment": {"_target_": "data.tables.tabular.load_csv", "path": "/etc/passwd"},
            }
        },
        "data.augment._target_='data.tables.tabular.load_csv' is not one of torchloom's builders",
    ),
    (
        "target inside _args_",
        {
            "data": {
                "_target_": "data.images.digits.load_digits",
                "_args_": [{"_target_": "builtins.eval"}],
            }
        },
        r"data._args_\[0\]._target_",
    ),
    (
        "alias through a trusted module",
        {"model": {"_target_": "models.mlp.math.prod"}},
        "models.mlp.math.prod",
    ),
    (
        "a target that is not a string",
        {"model": {"_target_": {"_target_": "os.system"}}},
        "model._target_=",
    ),
]


@pytest.mark.parametrize(
    ("config", "message"), [c[1:] for c in HOSTILE_CONFIGS], ids=[c[0] for c in HOSTILE_CONFIGS]
)
def test_a_hostile_stored_config_is_refused_naming_the_key(config, message):
    with pytest.raises(UserError, match=message):
        check_stored_config(config, "x.pt")


def test_only_the_exact_builders_of_our_own_yaml_files_are_allowed():
    allowed = allowed_builders()
    assert {
        "models.mlp.mlp",
        "models.cnn.cnn",
        "data.images.digits.load_digits",
        "utils.precision.Precision",
        "utils.schedulers.cosine",
        "torch.optim.AdamW",
    } <= allowed
    assert not any(name.endswith(".") for name in allowed)
    check_stored_config(load_checkpoint_config(), "a real checkpoint")  # a real config passes


def load_checkpoint_config() -> dict:
    from conftest import CONF
    from hydra import compose, initialize_config_dir

    import utils.config  # noqa: F401  (its resolvers)

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["run_name=x"])
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def test_evaluate_runs_nothing_from_an_interpolation_or_a_chained_target(base, tmp_path):

    state = load_checkpoint(base / "checkpoints/base/best.pt")
    marker = tmp_path / "evil.py"
    write = (
        "${oc.create:{_target_: pathlib.Path.write_text, _args_: [{_target_: pathlib.Path, "
        "_args_: ['MARKER']}, 'print(1)']}}"
    )
    state["config"]["model"]["dropout"] = write.replace("MARKER", str(marker))
    torch.save(state, tmp_path / "interpolated.pt")
    line = error_line(run_evaluate(tmp_path, "ckpt=interpolated.pt", ok=False))
    assert "model.dropout=" in line and "interpolation" in line
    state["config"]["model"]["dropout"] = 0.0
    state["config"]["model"]["_target_"] = "torch.nn.attention._fa4._fa4_import_module"
    torch.save(state, tmp_path / "chain.pt")
    assert "not one of torchloom's builders" in error_line(
        run_evaluate(tmp_path, "ckpt=chain.pt", ok=False)
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("group", "target", "extra"),
    [
        ("model", "data.tables.tabular.load_csv", {"path": "SECRET", "target": "x"}),
        ("task", "utils.tracking.local.CsvLog", {}),
        ("precision", "data.tables.tabular.load_csv", {"path": "SECRET"}),
        ("optim", "models.mlp.mlp", {"_partial_": True}),
    ],
)
def test_a_stored_group_may_name_only_its_own_builders(base, tmp_path, group, target, extra):
    """A checkpoint whose model names the CSV loader made evaluate.py, predict.py and a
    distillation teacher read any file and print its first line; each group's _target_ must
    be one of that group's own builders, refused before anything is built."""
    secret = tmp_path / "credentials.env"
    secret.write_text("AWS_SECRET_ACCESS_KEY=hunter2\n1\n")
    state = load_checkpoint(base / "checkpoints/base/best.pt")
    node = {
        "_target_": target,
        **{k: str(secret) if v == "SECRET" else v for k, v in extra.items()},
    }
    state["config"][group] = node
    torch.save(state, tmp_path / "crafted.pt")
    table = write_rows(tmp_path / "rows.csv", [f"p{i}" for i in range(64)], [[0] * 64])
    results = [
        run_evaluate(tmp_path, "ckpt=crafted.pt", ok=False),
        run_python(tmp_path, str(PREDICT), "ckpt=crafted.pt", f"input={table}", ok=False),
        run_train(tmp_path, *TINY, "trainer.max_epochs=1", "distill.teacher=crafted.pt", ok=False),
    ]
    for result in results:
        line = error_line(result)
        assert f"{group}._target_='{target}'" in line and "not one of torchloom's builders" in line
        assert "hunter2" not in result.stdout + result.stderr


def test_evaluate_never_downloads_because_a_stored_config_says_so(base, tmp_path):
    import yaml
    from conftest import CONF

    state = load_checkpoint(base / "checkpoints/base/best.pt")
    mnist = yaml.safe_load((CONF / "data/mnist.yaml").read_text())
    state["config"]["data"] = {**mnist, "root": str(tmp_path / "anywhere"), "download": True}
    torch.save(state, tmp_path / "downloads.pt")
    line = error_line(run_evaluate(tmp_path, "ckpt=downloads.pt", ok=False))
    assert "mnist not found in" in line and "data.download=false" in line
    assert not (tmp_path / "anywhere").exists()  # nothing fetched into the stored folder


# --- 2. A resume deletes only torchloom's own top-k files --------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "/tmp/victim.txt",
        "../victim.pt",
        "sub/epoch=001-val_acc=0.5000.pt",
        "best.pt",
        "epoch=001-val_acc=0.5000.pt.bak",
        "epoch=1-val_acc=0.5.pt",
        7,
        None,
    ],
)
def test_a_name_torchloom_does_not_write_is_never_a_top_k_file(tmp_path, name):
    assert own_top_k_file(tmp_path, name) is None
    assert checked_top_k([[0.5, name]], tmp_path) == []


def test_a_symlinked_top_k_name_pointing_away_is_not_ours(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    folder = tmp_path / "ck"
    folder.mkdir()
    link = folder / top_k_name(1, "val/acc", 0.5)
    link.symlink_to(victim)
    assert own_top_k_file(folder, link.name) is None
    assert (
        own_top_k_file(folder, top_k_name(2, "val/acc", 0.25))
        == folder / "epoch=002-val_acc=0.2500.pt"
    )


def test_resume_with_a_hostile_top_k_list_deletes_nothing_outside(base, tmp_path):
    folder = copy_run(base, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    state = load_checkpoint(folder / "last.pt")
    # Worse than anything new, so they are the first to drop out of the top 2.
    state["top_k"] += [[-1.0, str(victim)], [-2.0, "../../victim.txt"]]
    torch.save(state, folder / "last.pt")
    result = run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=4",
        "trainer.keep_top_k=2",
        "run_name=base",
        "resume=auto",
    )
    assert victim.read_text() == "precious"
    assert "ignoring top-k entry" in result.stdout + result.stderr
    tracked = sorted(name for _, name in load_checkpoint(folder / "last.pt")["top_k"])
    assert sorted(p.name for p in folder.glob("epoch=*.pt")) == tracked and len(tracked) == 2


def test_resuming_from_best_or_lowering_top_k_leaves_no_untracked_top_k_files(base, tmp_path):
    folder = copy_run(base, tmp_path)
    assert len(list(folder.glob("epoch=*.pt"))) == 2
    run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=3",
        "trainer.keep_top_k=1",
        "run_name=base",
        f"resume={folder / 'last.pt'}",
    )
    kept = sorted(p.name for p in folder.glob("epoch=*.pt"))
    tracked = [name for _, name in load_checkpoint(folder / "last.pt")["top_k"]]
    assert kept == sorted(tracked) and len(kept) == 1


# --- 3. A run name stays inside its roots ------------------------------------------------------


@pytest.mark.parametrize("name", ["../../outside", "/tmp/absolute", "a/../../b", "a//b", "."])
def test_a_run_name_that_escapes_is_refused_before_any_folder_is_made(tmp_path, name):
    result = run_train(tmp_path, f"run_name={name}", "trainer.max_epochs=1", ok=False)
    assert f"run_name={name!r} must be a relative path" in error_line(result)
    assert not list(tmp_path.rglob("*.pt")) and not (tmp_path / "runs").exists()


# --- 4. Checkpoints get a plain file's mode ----------------------------------------------------


def test_checkpoints_get_the_mode_open_would_give(tmp_path):
    previous = os.umask(0o022)
    try:
        save_atomic({"model": {}}, tmp_path / "last.pt")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "last.pt").stat().st_mode) == 0o644


def test_a_run_leaves_group_and_world_readable_checkpoints(base):
    for path in (base / "checkpoints/base").glob("*.pt"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path


def test_cleanup_keeps_a_live_writers_temporary_file_and_removes_dead_ones(tmp_path):
    host = socket.gethostname()
    live = tmp_path / f".last.pt.{host}-{os.getppid()}.abc.tmp"  # our parent is alive
    dead = tmp_path / f".last.pt.{host}-999999999.abc.tmp"
    foreign_fresh = tmp_path / ".last.pt.elsewhere-12.abc.tmp"
    foreign_old = tmp_path / ".best.pt.elsewhere-13.abc.tmp"
    for path in (live, dead, foreign_fresh, foreign_old):
        path.write_bytes(b"partial")
    hours_ago = time.time() - 7200
    os.utime(foreign_old, (hours_ago, hours_ago))
    remove_stale_temporary_files(tmp_path)
    assert live.exists() and foreign_fresh.exists()
    assert not dead.exists() and not foreign_old.exists()


# --- 5. The printed command survives a shell ---------------------------------------------------


def test_the_continue_command_gives_back_the_overrides_through_a_shell(tmp_path):
    overrides = [
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "model.hidden_sizes=[16, 8]",
        "run_name='a;touch pwned'",
        "trainer.max_epochs=2",
    ]
    result = run_train(tmp_path, *overrides, ok=False, env={"SIGNAL_AT_FORWARD": "5"})
    assert result.returncode == 3, result.stderr[-2000:]
    command = result.stdout.split("continue with:")[1].strip().splitlines()[0]
    words = shlex.split(command)
    assert words[:2] == ["python", "train.py"]
    given = [*overrides, *QUIET[str(TRAIN)]]  # with what the suite's runs leave out
    assert words[2:-1] == given and words[-1].startswith("resume=")
    assert not (tmp_path / "pwned").exists()


# --- 7. The monitor's direction follows the metric ---------------------------------------------


def test_monitor_mode_follows_the_metric_and_refuses_a_contradiction():
    assert monitor_mode("val/loss", "auto") == "min"
    assert monitor_mode("val/acc", "auto") == monitor_mode("val/acc_top5", "auto") == "max"
    assert monitor_mode("val/error_rate", "auto") == "min"
    assert monitor_mode("val/loss", "min") == "min"
    for monitor, mode in (("val/loss", "max"), ("val/acc", "min")):
        with pytest.raises(UserError, match="would keep the worst epoch"):
            monitor_mode(monitor, mode)
    with pytest.raises(UserError, match=r"set trainer\.monitor_mode=min or max"):
        monitor_mode("val/wobble", "auto")


def test_best_pt_is_the_lowest_loss_epoch_when_monitoring_the_loss(tmp_path):
    run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=4",
        "trainer.monitor=val/loss",
        "optim.lr=0.05",
        "run_name=loss",
    )
    losses = dict(scalars(tmp_path / "runs/loss")["val/loss"])
    metrics = read_metrics(tmp_path / "runs/loss")
    assert metrics["best_metric"] == pytest.approx(min(losses.values()))
    best = load_checkpoint(tmp_path / "checkpoints/loss/best.pt")
    assert best["best_metric"] == pytest.approx(min(losses.values()))


# --- 8. A resume with a changed config applies it exactly or refuses it --------------------------


def test_a_changed_lr_and_weight_decay_are_in_the_optimizer_after_resume(base, tmp_path):
    folder = copy_run(base, tmp_path)
    saved = load_checkpoint(folder / "last.pt")
    result = run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=3",
        "scheduler=none",
        "run_name=base",
        "optim.lr=0.0005",
        "optim.weight_decay=0.2",
        "resume=auto",
        ok=False,
    )
    # scheduler=none is another schedule type: refused, naming it, nothing written.
    assert "scheduler._target_" in error_line(result)
    assert load_checkpoint(folder / "last.pt")["global_step"] == saved["global_step"]
    result = run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=3",
        "run_name=base",
        "optim.lr=0.0005",
        "optim.weight_decay=0.2",
        "resume=auto",
    )
    assert "applying the changed optim.lr: 0.002 -> 0.0005" in result.stdout
    groups = load_checkpoint(folder / "last.pt")["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.2, 0.0]  # biases and norms stay at 0
    assert all(g["initial_lr"] == 0.0005 for g in groups)
    # Cosine over the new length at the last step: the floor (min_lr_ratio 0).
    assert all(g["lr"] == pytest.approx(0.0, abs=1e-7) for g in groups)


def test_a_longer_run_extends_the_schedule_and_a_new_precision_starts_its_scaler(base, tmp_path):
    run = (*TINY, "run_name=oc", "scheduler=onecycle", "scheduler.warmup_steps=3")
    run_train(tmp_path, *run, "trainer.max_epochs=2")
    result = run_train(tmp_path, *run, "trainer.max_epochs=4", "precision=fp16", "resume=auto")
    assert "applying the changed trainer.max_epochs: 2 -> 4" in result.stdout
    assert "loss scaling starts at" in result.stdout
    last = load_checkpoint(tmp_path / "checkpoints/oc/last.pt")
    # One cycle over the 4 epochs, to its very end, without torch's "stepped too often".
    assert (
        last["epoch"] == 4 and last["scheduler"]["per_step"]["total_steps"] == last["global_step"]
    )
    assert last["scaler"]  # fp16's scaler state is saved now


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("optim=sgd", "optim._target_"),
        ("trainer.monitor=val/loss", "trainer.monitor"),
        ("optim.decay_bias_and_norm=true", "optim.decay_bias_and_norm"),
        ("seed=3", "seed: 0 -> 3"),
    ],
)
def test_a_change_the_saved_state_cannot_carry_is_refused_in_one_line(
    base, tmp_path, override, named
):
    folder = copy_run(base, tmp_path)
    before = (folder / "last.pt").read_bytes()
    result = run_train(
        tmp_path, *TINY, "trainer.max_epochs=3", "run_name=base", override, "resume=auto", ok=False
    )
    assert named in error_line(result)
    assert (folder / "last.pt").read_bytes() == before


def test_a_weights_only_file_cannot_be_resumed_or_evaluated(base, tmp_path):

    weights = {"model": load_checkpoint(base / "checkpoints/base/best.pt")["model"]}
    torch.save(weights, tmp_path / "weights.pt")
    resumed = run_train(tmp_path, "resume=weights.pt", ok=False)
    assert "use init_from=weights.pt" in error_line(resumed)
    evaluated = run_evaluate(tmp_path, "ckpt=weights.pt", ok=False)
    assert "holds no torchloom config" in error_line(evaluated)


def test_a_checkpoint_of_a_newer_format_is_refused_naming_it(base, tmp_path):
    state = load_checkpoint(base / "checkpoints/base/last.pt")
    state["format_version"] = 99
    torch.save(state, tmp_path / "future.pt")
    with pytest.raises(UserError, match="format 99; this torchloom reads formats 1 to 2"):
        load_checkpoint(tmp_path / "future.pt")


# --- 10. Seeds do not collide -----------------------------------------------------------------


def test_small_seeds_never_collide_and_older_orders_stay():
    seeds = {mix_seed(seed, epoch) for seed in range(-64, 65) for epoch in range(16)}
    assert len(seeds) == 129 * 16
    assert mix_seed(-1, 0) != mix_seed(-2, 0)
    assert mix_seed(0, 3) == hash((0, 3)) & 0x7FFF_FFFF_FFFF_FFFF  # earlier runs' data order


def test_seeds_minus_one_and_minus_two_train_differently(tmp_path):
    for seed in (-1, -2):
        run_train(tmp_path, *TINY, "trainer.max_epochs=1", f"seed={seed}", f"run_name=s{seed}")
    first, second = (load_checkpoint(tmp_path / f"checkpoints/s{s}/last.pt") for s in (-1, -2))
    assert not torch.equal(first["model"]["1.weight"], second["model"]["1.weight"])


# --- 11. A skipped fp16 step leaves the scaler ready for the next ------------------------------


def test_fp16_skip_and_clipping_survive_a_skipped_step(tmp_path):
    result = run_train(
        tmp_path,
        "model=mlp",
        "model._target_=signalling_model.faulty_mlp",
        *TINY,
        "precision=fp16",
        "trainer.nonfinite=skip",
        "trainer.gradient_clip_val=1.0",
        "trainer.max_epochs=2",
        "run_name=fp16",
        env={"FAULT_AT": "3"},
    )
    metrics = read_metrics(tmp_path / "runs/fp16")
    assert metrics["train/skipped_steps"] == 1 and metrics["status"] == "completed"
    last = load_checkpoint(tmp_path / "checkpoints/fp16/last.pt")
    assert last["skipped_steps"] == 1  # counted across a resume too
    # The schedule counted only the steps taken.
    assert last["scheduler"]["per_step"]["last_epoch"] == last["global_step"] - 1
    assert "unscale_" not in result.stderr


# --- 12, 13. No run is silently overwritten --------------------------------------------------


def test_reusing_a_run_name_is_refused_and_overwrite_replaces_the_whole_run(base, tmp_path):
    folder = copy_run(base, tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    refused = run_train(tmp_path, *TINY, "trainer.max_epochs=1", "run_name=base", ok=False)
    assert "resume=auto" in error_line(refused) and "overwrite=true" in error_line(refused)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    run_train(tmp_path, *TINY, "trainer.max_epochs=1", "run_name=base", "overwrite=true")
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".pt") == ["best.pt", "last.pt"]
    assert len(list((tmp_path / "runs/base").glob("events.out.tfevents.*"))) == 1
    assert read_metrics(tmp_path / "runs/base")["epochs"] == 1


def test_overwrite_replaces_the_earlier_runs_refit_and_folds_and_no_run_takes_a_parts_name(
    tmp_path,
):
    """A run's refit and cv folds live in folders of its own (``<run>/refit``,
    ``<run>/fold-<k>``): overwrite=true left them behind, an earlier run's refit/best.pt beside
    the new run as if it were its refit. They go with the rest of the earlier run; folds alone
    refuse a new run without overwrite=true; a run of the user's named like a part is refused
    in one line naming run_name."""
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=1")
    runs, saved = tmp_path / "runs/t", tmp_path / "checkpoints/t"
    run_train(tmp_path, *run, "run_name=t")  # a small table: it refits
    assert (saved / "refit/best.pt").is_file() and (runs / "refit/metrics.json").is_file()
    run_train(tmp_path, *run, "run_name=t", "trainer.refit=false", "overwrite=true")
    assert not (saved / "refit").exists() and not (runs / "refit").exists()
    assert "refit/checkpoint" not in read_metrics(runs)
    run_train(tmp_path, *run, "run_name=t", "cv=3", "overwrite=true")  # over a plain run
    assert not (saved / "best.pt").exists() and (runs / "fold-2/oof.pt").is_file()
    run_train(tmp_path, *run, "run_name=t", "cv=2", "overwrite=true")  # one fold fewer
    assert not (runs / "fold-2").exists() and not (saved / "fold-2").exists()
    (runs / "metrics.json").unlink()  # as a cv killed before it pooled its folds leaves it
    (runs / "oof.csv").unlink()
    refused = run_train(tmp_path, *run, "run_name=t", ok=False)
    assert "already holds a run (runs/t/fold-0/" in error_line(refused)
    assert (saved / "fold-1/best.pt").is_file()  # nothing removed
    run_train(tmp_path, *run, "run_name=t", "trainer.refit=false", "overwrite=true")
    assert not [*runs.glob("fold-*"), *saved.glob("fold-*")] and (saved / "best.pt").is_file()
    for name, part in (("t/refit", "refit"), ("x/fold-2", "fold-2"), ("fold-0", "fold-0")):
        refused = run_train(tmp_path, *run, f"run_name={name}", ok=False)
        assert f"run_name={name!r}: {part!r} names a run's part" in error_line(refused)
    refused = run_train(tmp_path, *run, "run_name=y/refit", "cv=2", ok=False)
    assert "run_name='y/refit': 'refit' names a run's part" in error_line(refused)


def test_resume_auto_with_nothing_to_continue_is_a_new_run_never_beside_another(base, tmp_path):
    """resume=auto that finds no checkpoint starts a new run, and a new run never starts over
    another: it started beside a cv's folds (a plain command over a cv killed before it
    pooled), a cv started its folds beside a plain run's best.pt, and a run killed before its
    first checkpoint left its TensorBoard events to mix with the next attempt's."""
    copy_run(base, tmp_path)
    for path in [*(tmp_path / "checkpoints/base").iterdir(), tmp_path / "runs/base/metrics.json"]:
        path.unlink()  # as a kill before the first checkpoint leaves it: a history alone
    run_train(tmp_path, *TINY, "trainer.max_epochs=1", "run_name=base", "resume=auto")
    assert len(list((tmp_path / "runs/base").glob("events.out.tfevents.*"))) == 1

    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=1")
    run_train(tmp_path, *run, "run_name=t", "cv=2")
    (tmp_path / "runs/t/metrics.json").unlink()  # a cv killed before it pooled its folds
    saved = sorted((tmp_path / "checkpoints/t").rglob("*.pt"))
    refused = run_train(tmp_path, *run, "run_name=t", "resume=auto", ok=False)
    assert "it is a cv run: continue it with cv=K resume=auto" in error_line(refused)
    assert sorted((tmp_path / "checkpoints/t").rglob("*.pt")) == saved
    run_train(tmp_path, *run, "run_name=t", "cv=2", "resume=auto")  # what does continue it
    assert read_metrics(tmp_path / "runs/t")["cv"]["folds"] == 2

    run_train(tmp_path, *run, "run_name=p", "trainer.refit=false")
    refused = run_train(tmp_path, *run, "run_name=p", "cv=2", "resume=auto", ok=False)
    assert "cv=2 resume=auto continues a cv's folds, and it has none" in error_line(refused)
    assert not (tmp_path / "checkpoints/p/fold-0").exists()
    run_train(tmp_path, *run, "run_name=p", "cv=2", "resume=auto", "overwrite=true")
    kept = sorted(p.name for p in (tmp_path / "checkpoints/p").iterdir() if p.name != CLAIM_FILE)
    assert kept == ["fold-0", "fold-1"]


def test_resume_auto_refuses_when_every_checkpoint_is_unreadable(base, tmp_path):
    folder = copy_run(base, tmp_path)
    for path in folder.glob("*.pt"):
        path.write_bytes(b"\0" * 64)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = run_train(tmp_path, *TINY, "run_name=base", "resume=auto", ok=False)
    assert "no readable checkpoint in checkpoints/base" in error_line(result)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# --- Also found by reading the code -----------------------------------------------------------


def test_instance_and_rms_norm_weights_get_no_weight_decay():
    from utils.model.optim import parameter_groups

    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.InstanceNorm2d(4, affine=True), torch.nn.RMSNorm(4)
    )
    decay, no_decay = parameter_groups(model, 0.1)
    assert [tuple(p.shape) for p in decay["params"]] == [(4, 1, 3, 3)]
    assert len(no_decay["params"]) == 4  # conv bias, instance norm weight and bias, RMS weight


def test_a_cifar_batch_with_fewer_labels_than_images_is_refused(tmp_path):
    import pickle

    from conftest import write_cifar10

    from data.images.cifar10 import read_batch

    folder = write_cifar10(tmp_path) / "cifar-10-batches-py"
    with open(folder / "data_batch_1", "rb") as f:
        batch = pickle.load(f)
    batch[b"labels"] = batch[b"labels"][:-1]
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump(batch, f, protocol=2)
    with pytest.raises(UserError, match="has 20 images but 19 labels"):
        read_batch(folder / "data_batch_1")


def test_a_plateau_schedule_keeps_its_reductions_scaled_to_a_new_lr_on_resume():
    from utils.model.optim import hyperparameters
    from utils.schedulers import StepCounts, plateau

    def build(lr: float, factor: float):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        start = plateau(
            warmup_steps=0, monitor="val/acc", mode="max", factor=factor, patience=0, min_lr=0.0
        )
        schedule = start(optimizer, StepCounts(per_epoch=10, total=100))
        return optimizer, schedule

    optimizer, schedule = build(0.1, 0.5)
    for acc in (0.5, 0.4):  # no improvement at the second validation: one reduction
        schedule.after_optimizer_step()
        schedule.after_validation({"val/acc": acc})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    saved = (optimizer.state_dict(), schedule.state_dict())
    resumed, continued = build(0.2, 0.1)
    built = hyperparameters(resumed)
    resumed.load_state_dict(saved[0])
    continued.continue_changed(saved[1], resumed, built)
    assert resumed.param_groups[0]["lr"] == pytest.approx(0.1)  # 0.05 × 0.2 / 0.1
    assert continued.plateau.factor == 0.1 and continued.plateau.best == 0.5


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("config", "x"),
        ("epoch", "3"),
        ("top_k", {}),
        ("global_step", True),
        ("rng", None),
        ("early_stopping", "x"),
        ("skipped_steps", 1.5),
        ("best_epoch", True),
        ("best_metric", False),
    ],
)
def test_an_edited_training_checkpoint_is_refused_naming_the_key(base, key, value):
    from utils.checkpoint.format import check_training_checkpoint

    state = load_checkpoint(base / "checkpoints/base/last.pt")
    check_training_checkpoint(Path("last.pt"), state)
    state[key] = value
    with pytest.raises(UserError, match=f"its '{key}' is a"):
        check_training_checkpoint(Path("last.pt"), state)
