"""model=tabular (model=auto's choice for a table's rows): the preprocessing fitted to the
training split's quantiles, each embedding, k members trained on the mean of their losses and
averaged in evaluation, one line at start-up, and a run killed mid-epoch that resumes bit for
bit. Its exports against predict.py: tests/test_raw_exports.py (model=auto there)."""

from __future__ import annotations

import csv
import signal

import pytest
import torch
from conftest import PREDICT, checkpoint, error_line, killed_at, run_python, run_train, write_table
from omegaconf import OmegaConf

from data.batching.batches import BatchPlan, BatchTransform, TensorBatches
from data.batching.splits import TensorSplit, feature_quantiles
from models.auto import SHARED_KEYS, auto
from models.tabular import (
    LARGE_TABLE_ROWS,
    SMALL_TABLE_ROWS,
    PiecewiseEmbedding,
    RobustScaling,
    fitted_frequency_scale,
    fitted_grid,
    fitted_inputs,
    plain_indicators,
    smooth_clip,
    tabular,
)
from utils.errors import UserError
from utils.fit.teacher import Teacher
from utils.tasks._base import MembersLoss
from utils.tasks._classification import ClassificationLoss
from utils.tasks._regression import RegressionLoss, TargetScale

KEYS = dict(
    embedding="piecewise",
    d_embedding=8,
    bins=4,
    frequencies=6,
    frequency_scale=0.01,
    ensemble=4,
    hidden_sizes=[32],
    dropout=0.0,
)


def rows(n=400, seed=0):
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(seed))
    x[:, 3] = (x[:, 3] > 0.5).float()  # a 0/1 column: ties, a zero interquartile range
    x[:, 4] = x[:, 4].round()  # whole numbers: many tied quantiles
    return x


def test_the_quantiles_are_the_training_splits():
    x = rows()
    mean, std = x.mean(0).tolist(), x.std(0).tolist()
    grid = feature_quantiles(x, mean, std)
    expected = torch.quantile(
        (x - torch.tensor(mean)) / torch.tensor(std), torch.linspace(0, 1, 65), dim=0
    ).T
    torch.testing.assert_close(grid, expected, rtol=0, atol=1e-5)


def test_robust_scaling_centres_on_the_median_and_clips_smoothly():
    x = rows()
    scaling = RobustScaling(fitted_grid(5, feature_quantiles(x, [0.0] * 5, [1.0] * 5)))
    out = scaling(x)
    assert out[:, :3].median(0).values.abs().max() < 0.05  # the median maps to 0
    iqr = out[:, :3].quantile(0.75, 0) - out[:, :3].quantile(0.25, 0)
    assert torch.allclose(iqr, torch.full((3,), 1.349), atol=0.1)  # IQR/1.349: unit spread
    assert float(out.abs().max()) < 3.0  # x / sqrt(1 + (x/3)²) never reaches 3
    assert torch.allclose(
        smooth_clip(torch.tensor([0.0, 0.3])), torch.tensor([0.0, 0.3]), atol=0.002
    )
    assert bool(torch.isfinite(out).all())  # the 0/1 column: scaled by its range, not 0


def test_the_piecewise_encoding_of_known_values():
    edges = torch.tensor([[0.0, 1.0, 2.0, 4.0]])  # one feature, three bins
    embedding = PiecewiseEmbedding(edges, 2)
    x = torch.tensor([[-1.0], [0.5], [1.0], [3.0], [9.0]])
    ratio = (x[..., None] - embedding.left) / embedding.width
    encoded = torch.cat(
        [ratio[..., :1].clamp(max=1), ratio[..., 1:-1].clamp(0, 1), ratio[..., -1:].clamp(min=0)],
        dim=-1,
    )[:, 0]
    assert encoded.tolist() == [
        [-1.0, 0.0, 0.0],  # below the first edge: the first bin open-ended
        [0.5, 0.0, 0.0],
        [1.0, 0.0, 0.0],
        [1.0, 1.0, 0.5],
        [1.0, 1.0, 3.5],  # above the last: the last bin open-ended
    ]
    tied = PiecewiseEmbedding(torch.tensor([[0.0, 1.0, 1.0, 2.0]]), 2)  # a value many rows share
    on_it = torch.tensor([[1.0], [1.0 + 1e-7], [1.0 - 1e-7]])
    first = tied(on_it)
    assert torch.allclose(first[0], first[1], atol=1e-4) and torch.allclose(
        first[0], first[2], atol=1e-4
    )


@pytest.mark.parametrize("embedding", ["none", "linear", "periodic", "piecewise"])
def test_members_train_apart_and_evaluate_as_their_mean(embedding):
    x = rows()
    model = tabular(
        (5,),
        3,
        **{**KEYS, "embedding": embedding},
        feature_quantiles=feature_quantiles(x, [0.0] * 5, [1.0] * 5),
    )
    model.train()
    members = model(x)
    assert members.shape == (400, 4, 3)
    assert not torch.allclose(members[:, 0], members[:, 1])  # random-sign starts differ
    model.eval()
    torch.testing.assert_close(model(x), members.mean(dim=1))  # no dropout: the same forward
    labels = torch.randint(0, 3, (400,), generator=torch.Generator().manual_seed(1))
    loss = MembersLoss(ClassificationLoss(0.0, None, 3))(members, labels)
    each = [torch.nn.functional.cross_entropy(members[:, k], labels) for k in range(4)]
    torch.testing.assert_close(loss, torch.stack(each).mean())


def numbered_batches(members: int, rank: int = 0, world_size: int = 1, batch: int = 8):
    """Training batches of 50 rows whose inputs and labels are each row's number."""
    ids = torch.arange(50)
    split = TensorSplit(torch.stack([ids, ids], 1).float(), ids)
    plan = BatchPlan(
        batch_size=batch, train=True, seed=3, rank=rank, world_size=world_size, members=members
    )
    return TensorBatches(split, plan, BatchTransform([0.0], [1.0], torch.device("cpu")))


def test_each_member_draws_its_own_rows_member_0_the_shared_order():
    """model.share_batches=false: a training batch holds [B, k, F] rows, member m's from its own
    permutation of the epoch, member 0's the shared order's; every member sees every row once
    an epoch; a batch is a pure function of (seed, epoch, index), so a resume at a batch and
    another world size with the same global batch continue the same stream."""
    shared = [labels for _, labels in numbered_batches(1).epoch(2)]
    own = list(numbered_batches(4).epoch(2))
    assert [tuple(inputs.shape) for inputs, _ in own[:2]] == [(8, 4, 2), (8, 4, 2)]
    assert tuple(own[-1][0].shape) == (2, 4, 2)  # 50 = 6 × 8 + a partial batch of 2
    for (inputs, labels), one in zip(own, shared, strict=True):
        assert torch.equal(labels[:, 0], one) and torch.equal(inputs[..., 0].long(), labels)
    seen = torch.cat([labels for _, labels in own])  # [50, 4]
    assert all(sorted(seen[:, m].tolist()) == list(range(50)) for m in range(4))
    assert len({tuple(seen[:, m].tolist()) for m in range(4)}) == 4  # four orders
    resumed = list(numbered_batches(4).epoch(2, start=3))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(resumed, own[3:], strict=True))
    halves = [list(numbered_batches(4, rank, 2, batch=4).epoch(2)) for rank in (0, 1)]
    for index, (first, second) in enumerate(zip(*halves, strict=True)):  # drops the partial
        assert torch.equal(torch.cat([first[1], second[1]]), own[index][1])
    assert not torch.equal(own[0][1], next(numbered_batches(4).epoch(3))[1])  # epoch by epoch


def test_a_member_trains_on_its_own_targets_and_a_teacher_teaches_its_own_rows():
    """Each member's loss against its own rows' targets ([N, k] classes, [N, k, T] values);
    shared targets ([N] classes, [N, T] values, even with T = k) are every member's. A teacher
    is given each member's own rows."""
    outputs = torch.randn(6, 3, 5, generator=torch.Generator().manual_seed(0))
    own = torch.randint(0, 5, (6, 3), generator=torch.Generator().manual_seed(1))
    loss = MembersLoss(ClassificationLoss(0.0, None, 5))(outputs, own)
    each = [torch.nn.functional.cross_entropy(outputs[:, m], own[:, m]) for m in range(3)]
    torch.testing.assert_close(loss, torch.stack(each).mean())
    values, scale = (
        torch.randn(6, 3, 3),
        TargetScale([0.0] * 3, [1.0] * 3, [0.0] * 3, torch.device("cpu")),
    )
    regression = MembersLoss(RegressionLoss("mse", 1.0, scale))
    own_values = torch.randn(6, 3, 3)
    mse = [torch.nn.functional.mse_loss(values[:, m], own_values[:, m]) for m in range(3)]
    torch.testing.assert_close(regression(values, own_values), torch.stack(mse).mean())
    shared = torch.randn(6, 3)  # three targets for three members: still everyone's
    mse = [torch.nn.functional.mse_loss(values[:, m], shared) for m in range(3)]
    torch.testing.assert_close(regression(values, shared), torch.stack(mse).mean())
    node = type("Distill", (), {"temperature": 2.0, "alpha": 1.0})
    teacher = Teacher(torch.nn.Linear(4, 5), None, node, (None, ""))
    rows = torch.randn(6, 3, 4)
    kl = [teacher.blend(torch.tensor(0.0), outputs[:, m], rows[:, m]) for m in range(3)]
    torch.testing.assert_close(teacher.blend(torch.tensor(0.0), outputs, rows), sum(kl) / 3)


def test_a_rebuilt_model_takes_its_fitted_preprocessing_from_the_weights():
    x = rows()
    fitted = tabular((5,), 3, **KEYS, feature_quantiles=feature_quantiles(x, [0.0] * 5, [1.0] * 5))
    rebuilt = tabular((5,), 3, **KEYS)  # predict.py: no data, placeholders
    assert not torch.equal(rebuilt.preprocess.center, fitted.preprocess.center)
    rebuilt.load_state_dict(fitted.state_dict())
    fitted.eval(), rebuilt.eval()
    torch.testing.assert_close(rebuilt(x), fitted(x), rtol=0, atol=0)


@pytest.mark.parametrize("share", ["true", "false"])  # false: each member's rows its own
def test_a_table_run_says_its_model_and_resumes_bit_for_bit_after_kill_9(tmp_path, share):
    write_table(tmp_path / "t.csv", rows=300)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=3")
    run += (
        "model._target_=signalling_model.auto",
        "data.batch_size=32",
        "trainer.checkpoint_every_n_steps=3",
        f"model.share_batches={share}",
        "trainer.refit=false",  # a kill inside a refit: tests/test_refit.py
    )
    said = run_train(tmp_path, *run, "run_name=straight")
    assert "model=auto: the tabular model (robust scaling, periodic embeddings, 8 members" in (
        said.stdout + said.stderr
    )
    assert "frequencies from N(0, 0.01))" in said.stdout + said.stderr  # 255 training rows
    assert ("each on batches of its own" in said.stdout + said.stderr) == (share == "false")
    killed = run_train(tmp_path, *run, "run_name=killed", ok=False, env=killed_at(13))
    assert killed.returncode == -signal.SIGKILL
    run_train(tmp_path, *run, "run_name=killed", "resume=auto")
    a, b = checkpoint(tmp_path, "straight")["model"], checkpoint(tmp_path, "killed")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any("member_scale" in k for k in a) and any("center" in k for k in a)  # fitted


def test_a_table_checkpoint_stored_before_share_batches_resumes_and_a_change_is_refused(
    tmp_path,
):
    """A last.pt written before model.share_batches existed trained its members on shared
    batches, as the default still does: it resumes as it is; asked to resume with each member
    on rows of its own, which would change the data order, the resume is refused in one line
    naming the key."""
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "data.batch_size=32")
    run_train(tmp_path, *run, "trainer.max_epochs=1", "run_name=old")
    stored = checkpoint(tmp_path, "old")
    del stored["config"]["model"]["share_batches"]  # as the code before the key wrote it
    torch.save(stored, tmp_path / "checkpoints/old/last.pt")
    own = ("trainer.max_epochs=2", "model.share_batches=false", "resume=auto", "run_name=old")
    refused = run_train(tmp_path, *run, *own, ok=False)
    assert refused.returncode == 2
    assert "model.share_batches: True -> False" in error_line(refused)
    run_train(tmp_path, *run, "trainer.max_epochs=2", "resume=auto", "run_name=old")
    assert checkpoint(tmp_path, "old")["epoch"] == 2


def test_the_frequencies_start_wide_from_8000_training_rows(tmp_path):
    """frequency_scale=auto: N(0, 0.01) under LARGE_TABLE_ROWS training rows, N(0, 3) from
    them (docs/real-data.md); a number given is kept; a rebuilt model (no rows) loads its own."""
    assert fitted_frequency_scale("auto", LARGE_TABLE_ROWS - 1) == 0.01
    assert fitted_frequency_scale("auto", LARGE_TABLE_ROWS) == 3.0
    assert fitted_frequency_scale("auto", None) == 0.01
    assert fitted_frequency_scale(0.3, 10**6) == 0.3
    write_table(tmp_path / "t.csv", rows=11500)  # 70% trains: 8,050 rows
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=1")
    said = run_train(tmp_path, *run, "data.batch_size=512", "trainer.refit=false", "run_name=wide")
    out = said.stdout + said.stderr
    assert "robust scaling, periodic embeddings, 8 members sharing a 512 MLP, " in out
    assert "frequencies from N(0, 3); fitted to 8,050 training rows)" in out
    assert "'train': 8050" in out
    wide = checkpoint(tmp_path, "wide")["model"]["embed.frequencies"]
    assert 1.5 < float(wide.std()) < 6  # started wide and stays so after an epoch


def test_under_1000_rows_the_inputs_are_clamped_unembedded_and_an_older_checkpoint_as_it_was(
    tmp_path,
):
    """embedding=auto, robust_scaling=auto: under SMALL_TABLE_ROWS the standardised inputs
    clamped to the training range and no embedding, robust and periodic from there and when
    the rows are not known (docs/real-data.md). The rows go into the inputs record, so
    predict.py rebuilds what trained; a value far outside the range predicts as its edge. A
    checkpoint stored before model.table_fitted (robust and periodic on any table) rebuilds
    so, and a resume of it names the key."""
    assert fitted_inputs("auto", "auto", SMALL_TABLE_ROWS - 1) == ("none", "range")
    assert fitted_inputs("auto", "auto", SMALL_TABLE_ROWS) == ("periodic", "robust")
    assert fitted_inputs("auto", "auto", None) == ("periodic", "robust")
    assert fitted_inputs("linear", False, 10) == ("linear", "none")
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=size", "task=regression")
    run += ("trainer.max_epochs=2", "trainer.refit=false")
    said = run_train(tmp_path, *run, "run_name=new").stdout
    assert "(inputs clamped to the training range, no embeddings, 8 members sharing" in said
    assert "fitted to 84 training rows)" in said
    new = checkpoint(tmp_path, "new", "best.pt")
    assert new["inputs"]["train_rows"] == 84 and "preprocess.high" in new["model"]
    assert not any(key.startswith("embed.") for key in new["model"])
    lines = ["weight,colour,kind", *(f"{w},g,big" for w in ("500", "1e8", "1e30", "-1e8", "-1e30"))]
    (tmp_path / "far.csv").write_text("\n".join(lines) + "\n")
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/new", "input=far.csv", "out=far.p.csv")
    with open(tmp_path / "far.p.csv", newline="") as f:
        far = [row["size"] for row in csv.DictReader(f)]
    assert far[1] == far[2] != far[0] and far[3] == far[4] != far[0]
    run_train(tmp_path, *run, "model.table_fitted=false", "run_name=old")
    old = checkpoint(tmp_path, "old", "best.pt")
    assert "preprocess.scale" in old["model"] and "embed.frequencies" in old["model"]
    del old["config"]["model"]["table_fitted"], old["inputs"]["train_rows"]  # as before the key
    torch.save(old, tmp_path / "before.pt")
    for name, out in (("checkpoints/old/best.pt", "old.csv"), ("before.pt", "before.csv")):
        run_python(tmp_path, str(PREDICT), f"ckpt={name}", "input=t.csv", f"out={out}")
    assert (tmp_path / "before.csv").read_text() == (tmp_path / "old.csv").read_text()
    resumed = run_train(tmp_path, *run, "resume=before.pt", "run_name=again", ok=False)
    assert "model.table_fitted: False -> True" in error_line(resumed)
    for bad in (-5, 2**70, "301"):  # edited: one line
        old["inputs"]["train_rows"] = bad
        torch.save(old, tmp_path / "edited.pt")
        edited = run_python(tmp_path, str(PREDICT), "ckpt=edited.pt", "input=t.csv", ok=False)
        assert f"train_rows={str(bad)[:40]} is not a count" in error_line(edited)


def test_a_refit_builds_the_model_its_run_was_fitted_to(tmp_path):
    """910 training rows, 1,105 with val: the refit trains on the joined rows the model its
    run validated (unembedded, clamped), as it keeps the run's batch size, not the one that
    1,105 rows alone would choose; its record keeps the rows that fitted it."""
    write_table(tmp_path / "t.csv", rows=1300)  # 70% trains, 15% validates
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=1")
    said = run_train(tmp_path, *run, "run_name=r").stdout
    assert said.count("no embeddings, 8 members sharing a 512 MLP; fitted to 910 training") == 2
    refit = checkpoint(tmp_path, "r/refit", "best.pt")
    assert refit["inputs"]["train_rows"] == 910 and "preprocess.high" in refit["model"]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("model.bins=1000", "model.bins=1000 is out of range"),
        ("model.frequency_scale=0", "model.frequency_scale=0 is out of range"),
        ("model.frequency_scale=wide", "model.frequency_scale='wide' is out of range"),
        ("model.embedding=quantile", "model.embedding"),
        ("model.share_batches=sometimes", "model.share_batches"),
    ],
)
def test_a_wrong_tabular_setting_is_one_line(tmp_path, override, said):
    write_table(tmp_path / "t.csv", rows=60)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "model=tabular", override)
    result = run_train(tmp_path, *run, ok=False)
    assert result.returncode == 2 and said in error_line(result)


def test_a_checkpoint_stored_before_the_tabular_model_rebuilds_the_mlp_it_trained(tmp_path):
    """model=auto's config gained model.table (tabular); a stored config without it is one
    written when auto gave a table the MLP, and predict.py rebuilds that MLP."""
    assert not hasattr(auto((5,), 3, [64], [8], 5, 0.2), "member_scale")  # no key: the MLP
    assert hasattr(auto((5,), 3, [64], [8], 5, 0.2, "tabular"), "member_scale")
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=2")
    run_train(tmp_path, *run, "model.table=mlp", "run_name=old")
    stored = torch.load(tmp_path / "checkpoints/old/last.pt", weights_only=True)
    del stored["config"]["model"]["table"]  # as the code before the key wrote it
    torch.save(stored, tmp_path / "old.pt")
    result = run_python(tmp_path, str(PREDICT), "ckpt=old.pt", "input=t.csv", "out=p.csv")
    assert result.returncode == 0 and (tmp_path / "p.csv").read_text().count("\n") == 121


def test_model_auto_gives_a_table_the_hidden_sizes_and_dropout_asked_for(tmp_path):
    """model=auto's hidden_sizes and dropout shape the tabular model it builds for a table
    (they had been dropped, and the defaults trained, without a word); a wrong one is refused
    in one line naming the key; a checkpoint stored before model.table_sizes trained the
    defaults whatever it said, and predict.py rebuilds those."""
    widths = [
        m.out_features
        for m in auto((5,), 3, [24, 12], [8], 5, 0.1, "tabular", table_sizes=True).backbone
        if hasattr(m, "out_features")
    ]
    assert widths == [24, 12]
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "data.batch_size=32")
    said = run_train(
        tmp_path,
        *run,
        "trainer.max_epochs=1",
        "model.hidden_sizes=[24,12]",
        "model.dropout=0.1",
        "model.kernel_size=7",  # the 1-D CNN's: said to do nothing here
        "run_name=asked",
    )
    assert "8 members sharing a 24-12 MLP" in said.stdout + said.stderr
    assert (
        "model=auto: model.kernel_size=7 does nothing here: the tabular model does not read it"
    ) in said.stdout + said.stderr
    asked = checkpoint(tmp_path, "asked")["model"]
    assert asked["backbone.0.weight"].shape[0] == 24 and asked["backbone.3.weight"].shape == (
        12,
        24,
    )
    for wrong, key in (
        ("model.dropout=1.5", "model.dropout"),
        ("model.hidden_sizes=[0]", "model.hidden_sizes"),
    ):
        assert key in error_line(run_train(tmp_path, *run, wrong, "run_name=wrong", ok=False))
    # as the code before the key trained it: the defaults' one layer of 512, whatever was asked
    old = ("model.table_sizes=false", "model.hidden_sizes=[24]", "run_name=old")
    run_train(tmp_path, *run, "trainer.max_epochs=1", *old)
    stored = checkpoint(tmp_path, "old")
    assert stored["model"]["backbone.0.weight"].shape[0] == 512
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/old", "input=t.csv", "out=old.csv")
    del stored["config"]["model"]["table_sizes"]  # as the code before the key wrote it
    torch.save(stored, tmp_path / "checkpoints/old/last.pt")
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/old", "input=t.csv", "out=before.csv")
    assert (tmp_path / "before.csv").read_text() == (tmp_path / "old.csv").read_text()


def test_model_auto_says_which_keys_the_model_it_chose_does_not_read(caplog):
    """model=auto's shared keys hold conf/model/auto.yaml's values; another value of one the
    chosen model does not read (the CNN's channels on a table, an MLP's widths on images, any
    on texts, a table's own keys on images or with model.table=mlp) is said in one line naming
    it, and a key it reads, at its default or not given (a config stored before it), is not."""
    yaml = OmegaConf.load(PREDICT.parent / "conf/model/auto.yaml")  # the repository's
    assert {key: OmegaConf.to_object(yaml)[key] for key in SHARED_KEYS} == SHARED_KEYS
    cases = [
        (((3, 32, 32), [64], [32, 64, 128], 5, 0.2), {}, "model.hidden_sizes=[64]"),
        (((3, 32, 32), [512], [8, 16], 5, 0.5), {}, None),  # the CNN reads both
        (((3, 100), [512], [32, 64, 128], 9, 0.2), {}, None),  # the 1-D CNN: kernel_size
        (((3, 32, 32), [512], [32, 64, 128], 9, 0.2), {}, "model.kernel_size=9"),
        (((12,), [512], [32, 64, 128], 5, 0.3), {"vocab_size": 50, "pad_id": 0}, "dropout=0.3"),
        (
            ((5,), [64], [8], 5, 0.2),
            {"table": "tabular"},
            "model.hidden_sizes=[64], model.channels=[8]",
        ),
        # a table's own keys: unread on any other kind, and by model.table=mlp's MLP
        (((3, 32, 32), [512], [32, 64, 128], 5, 0.2), {"share_batches": False}, "batches=False"),
        (((3, 100), [512], [32, 64, 128], 5, 0.2), {"table": "mlp"}, "model.table='mlp'"),
        (
            ((5,), [64], [32, 64, 128], 5, 0.2),
            {"table": "mlp", "embed_indicators": False, "table_sizes": True},
            "model.embed_indicators=False does nothing here: the MLP",
        ),
        (((5,), [64], [32, 64, 128], 5, 0.2), {"table": "tabular", "table_sizes": True}, None),
        (((5,), [64], [32, 64, 128], 5, 0.2), {}, None),  # stored before the keys: the MLP
    ]
    for (shape, *keys), more, said in cases:
        caplog.clear()
        with caplog.at_level("WARNING", logger="torchloom"):
            auto(shape, 3, *keys, **more)
        lines = [r.getMessage() for r in caplog.records if "does nothing here" in r.getMessage()]
        assert (said in lines[0]) if said else not lines, (shape, keys, lines)
    with pytest.raises(UserError, match=r"model.table='trees' must be tabular or mlp"):
        auto((3, 32, 32), 3, [512], [32, 64, 128], 5, 0.2, table="trees")  # on any kind


@pytest.mark.parametrize(
    ("key", "before", "change"),
    [("table_sizes", "false", "False -> True"), ("embed_indicators", "true", "True -> auto")],
)
def test_a_checkpoint_stored_before_a_model_key_resumes_as_it_was_given_the_keys_old_value(
    tmp_path, key, before, change
):
    """A last.pt without a model key added later compares as the value that did what the
    code before it did: resuming it with the new default is refused in one line naming the
    key and both values; given the old value, it resumes."""
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "data.batch_size=32")
    run_train(tmp_path, *run, "trainer.max_epochs=1", f"model.{key}={before}", "run_name=old")
    stored = checkpoint(tmp_path, "old")
    del stored["config"]["model"][key]  # as the code before the key wrote it
    torch.save(stored, tmp_path / "checkpoints/old/last.pt")
    again = ("trainer.max_epochs=2", "resume=auto", "run_name=old")
    refused = run_train(tmp_path, *run, *again, ok=False)
    assert f"model.{key}: {change}" in error_line(refused)
    assert "give each key its checkpoint's value" in error_line(refused)
    run_train(tmp_path, *run, *again, f"model.{key}={before}")
    assert checkpoint(tmp_path, "old")["epoch"] == 2


def test_the_0_1_columns_enter_as_they_are_and_an_older_checkpoint_rebuilds_them_embedded(
    tmp_path,
):
    """With model.embed_indicators=false a table's numbers are embedded and its one-hot
    categories and gap flags (after them) go to the MLP as they are (auto: once there are
    more than 64); a checkpoint stored before the key existed embedded them all, and
    predict.py rebuilds it so, from the same column record."""
    assert [plain_indicators("auto", n) for n in (None, 3, 64, 65)] == [0, 0, 0, 65]
    assert plain_indicators(False, 3) == 3 and plain_indicators(True, 400) == 0
    write_table(tmp_path / "t.csv", rows=120)  # size, weight, colour (r, g, b)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=2")
    run += ("model.table_fitted=false",)  # embedded at any size
    said = run_train(tmp_path, *run, "model.embed_indicators=false", "run_name=new").stdout
    assert "periodic embeddings, 3 0/1 columns as they are" in said
    run_train(tmp_path, *run, "run_name=old")  # auto: 3 columns are embedded
    new, old = checkpoint(tmp_path, "new"), checkpoint(tmp_path, "old")
    assert new["model"]["embed.frequencies"].shape == (2, 48)  # the two numbers only
    assert new["model"]["member_scale.weight"].shape == (8, 2 * 16 + 3)
    assert old["model"]["member_scale.weight"].shape == (8, 5 * 16)
    for name in ("new", "old"):
        out = f"{name}.csv"
        run_python(tmp_path, str(PREDICT), f"ckpt=checkpoints/{name}", "input=t.csv", f"out={out}")
    del old["config"]["model"]["embed_indicators"]  # as the code before the key wrote it
    torch.save(old, tmp_path / "before.pt")
    run_python(tmp_path, str(PREDICT), "ckpt=before.pt", "input=t.csv", "out=before.csv")
    assert (tmp_path / "before.csv").read_text() == (tmp_path / "old.csv").read_text()
    # auto, on a category of 70 values: they go as they are, and predict.py rebuilds that
    lines = ["size,city,kind", *(f"{i % 13},c{i % 70},{'ab'[i % 3 > 0]}" for i in range(210))]
    (tmp_path / "wide.csv").write_text("\n".join(lines) + "\n")
    wide = ("data=csv", "data.path=wide.csv", "data.target=kind", "trainer.max_epochs=1")
    wide += ("model.table_fitted=false",)
    said = run_train(tmp_path, *wide, "run_name=wide").stdout
    assert "periodic embeddings, 70 0/1 columns as they are" in said
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/wide", "input=wide.csv", "out=w.csv")
    assert (tmp_path / "w.csv").read_text().count("\n") == 211
    # the builder counts the features after the numbers; without a table, all are embedded
    model = tabular((5,), 3, **{**KEYS, "embed_indicators": False}, indicator_features=3)
    assert model.plain == 3 and model.member_scale.weight.shape[1] == 2 * KEYS["d_embedding"] + 3
    assert tabular((5,), 3, **{**KEYS, "embed_indicators": False}).plain == 0


@pytest.mark.parametrize(
    ("buffer", "value", "said"),
    [
        ("preprocess.scale", float("nan"), "is not finite (NaN or Inf)"),
        ("preprocess.scale", 0.0, "are NaN or Inf"),
        ("preprocess.low", float("nan"), "is not finite (NaN or Inf)"),  # the clamp's
    ],
)
def test_a_checkpoint_edited_to_give_nan_is_refused_in_one_line_and_writes_no_csv(
    tmp_path, buffer, value, said
):
    """A fitted buffer edited to NaN is refused as it loads; one edited to 0 (finite, yet a
    division by it) is refused when the outputs come back NaN: never a CSV of NaN."""
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=2")
    robust = ("model.table_fitted=false",) if buffer == "preprocess.scale" else ()
    run_train(tmp_path, *run, *robust, "run_name=h")
    stored = torch.load(tmp_path / "checkpoints/h/last.pt", weights_only=True)
    stored["model"][buffer] = torch.full_like(stored["model"][buffer], value)
    torch.save(stored, tmp_path / "edited.pt")
    result = run_python(
        tmp_path, str(PREDICT), "ckpt=edited.pt", "input=t.csv", "out=p.csv", ok=False
    )
    assert result.returncode == 2 and said in error_line(result)
    assert not (tmp_path / "p.csv").exists()


def test_a_value_far_past_the_training_range_clips_to_the_edge_not_to_the_median(tmp_path):
    """Smooth clipping bounds a scaled value before it squares it: a weight of 1e30 (finite
    as a float32, its square is not) predicts as 1e8 does, at the clipped edge, where it once
    overflowed to inf and was read as the median; -1e30 as -1e8, at the other edge."""
    assert smooth_clip(torch.tensor([1e30, -3e38, 1e8])).tolist() == [3.0, -3.0, 3.0]
    write_table(tmp_path / "t.csv", rows=120)  # weight: about 500 ± 100
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=2")
    run_train(tmp_path, *run, "run_name=far")
    weights = ["500", "1e8", "1e30", "-1e8", "-1e30"]
    lines = ["size,weight,colour", *(f"0.1,{w},g" for w in weights)]
    (tmp_path / "far.csv").write_text("\n".join(lines) + "\n")
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/far", "input=far.csv", "out=p.csv")
    with open(tmp_path / "p.csv", newline="") as f:
        said = {
            w: {k: v for k, v in r.items() if k not in ("input", "weight")}
            for w, r in zip(weights, csv.DictReader(f), strict=True)
        }
    assert said["1e30"] == said["1e8"] != said["500"]
    assert said["-1e30"] == said["-1e8"] != said["500"]
