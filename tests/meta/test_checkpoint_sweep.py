"""Resuming from bad checkpoints: a seeded sweep of altered, truncated and re-signed files with
wrong types, out-of-range epochs and non-finite values. Every bad file raises
:class:`CheckpointError` naming the file (never another exception, never a resumed run); the
valid variants resume exactly as the original does."""

from __future__ import annotations

import copy
import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from experiments.run_config import load_config
from metasampler.config import TrainConfig
from metasampler.files import save_checksummed
from metasampler.learned import NNSGHMC
from metasampler.meta.checkpoint import CHECKPOINT_NAME, CheckpointError, read_checkpoint
from metasampler.meta.trainer import MetaTrainer
from metasampler.staging import owner_tag
from tasks.registry import ProblemFamily

SEED = 20260311
EPOCHS = 2  # the run's train.epochs; the checkpoint is written after epoch 2
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "toy_gaussian.yaml"


def settings(epochs: int = EPOCHS) -> TrainConfig:
    return TrainConfig(
        epochs=epochs, sub_epochs=1, steps_per_sub_epoch=10, n_chains=6, unroll=5,
        cross_chain_every=2, in_chain_burn_in=2, in_chain_thinning=2, in_chain_chains=3,
        replay_prob=0.5, replay_capacity=20, checkpoint_every=1, eval_every=0,
        average_last=1,
    )  # fmt: skip


@pytest.fixture(scope="module")
def family() -> ProblemFamily:
    cfg = load_config(None, ["task.kind=gaussian", "task.dim=3", "task.cov=diagonal"])
    return ProblemFamily(cfg.task)


def trainer(run_dir: Path, family: ProblemFamily, epochs: int = EPOCHS) -> MetaTrainer:
    sampler = NNSGHMC(eta=0.02, q_hidden=(4,), d_hidden=(4,), seed=1)
    return MetaTrainer(
        sampler, family, settings(epochs), run_dir=run_dir, seed=0, progress=False,
        extra_checkpoint={"config": {"seed": 0, "train": {"epochs": epochs}}},
    )  # fmt: skip


@pytest.fixture(scope="module")
def original(tmp_path_factory, family) -> tuple[bytes, dict]:
    """A real checkpoint (after epoch 2, with a replay pool, an averaged net and Adam's
    moments): its bytes and payload."""
    run_dir = tmp_path_factory.mktemp("run")
    trainer(run_dir, family).train()
    path = run_dir / CHECKPOINT_NAME
    return path.read_bytes(), read_checkpoint(path)


def fingerprint(t: MetaTrainer) -> tuple:
    """What a resumed trainer holds."""
    state = t.state_dict()
    tensors = []

    def walk(value, name):
        if isinstance(value, torch.Tensor):
            tensors.append((name, value.dtype, tuple(value.shape), value.flatten().tolist()))
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(value[key], f"{name}.{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{name}[{i}]")
        else:
            tensors.append((name, repr(value)))

    walk(state, "")
    return tuple(tensors)


def signed(payload) -> bytes:
    """``payload`` written as metasampler writes checkpoints (with a valid checksum), so only
    the content checks can refuse it."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    return (
        b"metasampler-checkpoint sha256 " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    )


def unchecked(payload) -> bytes:
    """``payload`` as a checkpoint written before the checksum line existed."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def edited(payload: dict, edit) -> dict:
    copy_ = copy.deepcopy(payload)
    edit(copy_)
    return copy_


def setter(*keys, value):
    def edit(state):
        target = state
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value(target[keys[-1]]) if callable(value) else value

    return edit


def deleter(*keys):
    def edit(state):
        target = state
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return edit


def poisoned(value: float):
    def edit(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        tensor.view(-1)[0] = value
        return tensor

    return edit


class NotATensor:
    """An object that ``weights_only`` loading refuses."""


def bad_payloads(payload: dict) -> list[tuple[str, object]]:
    """Re-signed checkpoints whose contents are wrong: ``(kind, payload)``."""
    out: list[tuple[str, object]] = []

    def put(kind: str, *keys, value) -> None:
        out.append((kind, edited(payload, setter(*keys, value=value))))

    nan, inf = float("nan"), float("inf")
    for whole in ([payload["epoch"]], (1, 2), None, 3, "checkpoint", {"epoch": 1}, {}):
        out.append(("wrong type (whole)", whole))
    for key in sorted(payload):
        out.append(("missing entry", edited(payload, deleter(key))))
    for epoch in (-3, -1, EPOCHS + 1, 10**9, 1.5, "2", True, None, torch.tensor(2)):
        put("epoch out of range or type", "epoch", value=epoch)
    put("epoch and history disagree", "epoch", value=1)
    put("epoch and history disagree", "epoch", value=0)
    for name in sorted(payload["sampler"]):
        if payload["sampler"][name].is_floating_point():
            for value in (nan, inf):
                put("non-finite weights", "sampler", name, value=poisoned(value))
    for value in ([1, 2], {"w": 1.0}, None, "nets"):
        put("wrong type (sampler)", "sampler", value=value)
    put("another architecture", "sampler", "f_q.head.weight", value=torch.zeros(1, 7))
    out.append(("another architecture", edited(payload, deleter("sampler", "f_q.head.bias"))))
    for index in sorted(payload["optimizer"]["state"]):
        for key in ("exp_avg", "exp_avg_sq"):
            put("non-finite optimiser", "optimizer", "state", index, key, value=poisoned(nan))
        put("optimiser shape", "optimizer", "state", index, "exp_avg", value=torch.zeros(2, 2, 2))
    for value in ([], {}, {"state": {}}, None, "adam"):
        put("wrong type (optimizer)", "optimizer", value=value)
    put("non-finite optimiser", "optimizer", "param_groups", 0, "lr", value=nan)
    put("optimiser groups", "optimizer", "param_groups", value=[])
    put("optimiser groups", "optimizer", "param_groups", 0, "params", value=[0])
    for value in ("x", {"mean": {}}, {"started_at": 1, "mean": [1]}, 3):
        put("wrong type (average)", "average", value=value)
    first_mean = sorted(payload["average"]["mean"])[0]
    put("non-finite average", "average", "mean", first_mean, value=poisoned(nan))
    put("average of another architecture", "average", "mean", value={"w": torch.zeros(3)})
    for value in (torch.zeros(5), torch.zeros(3, dtype=torch.uint8), "state", None):
        put("wrong generator", "generator", value=value)
    for key, value in (
        ("size", payload["replay"]["capacity"] + 1), ("size", -1), ("capacity", 0),
        ("capacity", "20"), ("replay_prob", torch.tensor(2.0)), ("replay_prob", None),
        ("theta", torch.zeros(1, 3)), ("momentum", torch.zeros(2)), ("theta", "theta"),
    ):  # fmt: skip
        put("replay out of range", "replay", key, value=value)
    for key in ("theta", "momentum"):
        put("non-finite replay", "replay", key, value=poisoned(-inf))
    put("wrong type (replay)", "replay", value=[1])
    out.append(("replay out of range", edited(payload, deleter("replay", "size"))))
    for key, value in (
        ("loss", [1.0]), ("loss", [nan, 1.0]), ("loss", "low"), ("loss", [1.0, "2"]),
        ("evals", [{"epoch": 5}]), ("evals", ["x"]), ("evals", [{"kl": 1.0}]), ("evals", None),
        ("seconds", -1.0), ("seconds", inf), ("seconds", "1"),
    ):  # fmt: skip
        put("history out of range", "history", key, value=value)
    put("wrong type (history)", "history", value=[])
    for value in (0, "1", 2, 1.0, True):
        put("world size", "world_size", value=value)
    put("another config", "config", "seed", value=1)
    return out


VALID_EDITS = [
    # More epochs than configured are refused, but a run extended to more epochs may resume.
    ("extra entries", lambda state: state.update(note="kept")),
    (
        "non-finite metrics",
        lambda state: state["history"]["evals"].append({"epoch": 1, "kl": float("nan")}),
    ),  # fmt: skip
]


def variants(blob: bytes, payload: dict, rng: random.Random):
    """``(kind, bytes, bad)`` triples."""
    for cut in sorted(rng.sample(range(len(blob)), 60)):
        yield "truncation", blob[:cut], True
    for _ in range(150):
        position, bit = rng.randrange(len(blob)), rng.randrange(8)
        flipped = bytearray(blob)
        flipped[position] ^= 1 << bit
        yield "bit flip", bytes(flipped), True
    for _ in range(20):
        position = rng.randrange(len(blob) - 8)
        garbled = bytearray(blob)
        garbled[position : position + 8] = rng.randbytes(8)
        yield "garbled bytes", bytes(garbled), True
    yield "empty file", b"", True
    for size in (1, 100, 5000):
        yield "random bytes", rng.randbytes(size), True
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("data.txt", "not a checkpoint")
    yield "another zip file", archive.getvalue(), True
    yield "objects that are not tensors", signed({**payload, "note": NotATensor()}), True
    for kind, bad in bad_payloads(payload):
        yield kind, signed(bad), True
    for i, (kind, bad) in enumerate(bad_payloads(payload)):
        if i % 4 == 0:  # (a quarter of them again, in the unchecked format of older files)
            yield f"{kind}, unchecked", unchecked(bad), True
    yield "original", blob, False
    yield "original, unchecked", unchecked(payload), False
    for kind, edit in VALID_EDITS:
        yield kind, signed(edited(payload, edit)), False


def test_bad_checkpoints_raise_checkpoint_error_and_never_resume(tmp_path, family, original):
    blob, payload = original
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes(blob)
    reference = trainer(tmp_path, family)
    reference.resume()
    expected = fingerprint(reference)
    outcomes: Counter = Counter()
    tracebacks, silent = [], []
    started = time.perf_counter()
    for i, (kind, data, bad) in enumerate(variants(blob, payload, random.Random(SEED))):
        path.write_bytes(data)
        resumed = trainer(tmp_path, family)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                resumed.resume()
        except CheckpointError as err:
            if str(path) not in str(err):
                tracebacks.append(f"#{i} {kind}: the message does not name the file: {err}")
            outcomes["rejected" if bad else "valid but rejected"] += 1
            if not bad:
                tracebacks.append(f"#{i} {kind}: a valid checkpoint was refused: {err}")
            continue
        except Exception as err:  # a traceback the user would see
            tracebacks.append(f"#{i} {kind}: {type(err).__name__}: {str(err)[:200]}")
            continue
        if bad:
            silent.append(f"#{i} {kind}: resumed from a bad checkpoint (epoch {resumed.epoch})")
        else:
            outcomes["resumed"] += 1
            if kind.startswith("original"):
                assert fingerprint(resumed) == expected, kind
    seconds = time.perf_counter() - started
    total = sum(outcomes.values()) + len(tracebacks) + len(silent)
    print(f"checkpoint sweep: {total} variants, {dict(outcomes)}, {len(tracebacks)} tracebacks, "
          f"{len(silent)} silent resumes, {seconds:.1f} s")  # fmt: skip
    assert total >= 350, total
    assert not tracebacks, f"{len(tracebacks)} of {total}:\n" + "\n".join(tracebacks[:20])
    assert not silent, f"{len(silent)} of {total}:\n" + "\n".join(silent[:20])
    assert outcomes["resumed"] == 2 + len(VALID_EDITS)
    assert outcomes["rejected"] == total - outcomes["resumed"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (lambda p: signed([p["epoch"]]), r"it holds a list, not a checkpoint"),
        (
            lambda p: signed(edited(p, setter("epoch", value=-3))),
            r"'epoch' is -3: the epochs done cannot be negative",
        ),  # fmt: skip
        (
            lambda p: signed(edited(p, setter("epoch", value=3))),
            r"after epoch 3 but train.epochs is 2",
        ),  # fmt: skip
        (
            lambda p: signed(
                edited(p, setter("sampler", "f_q.head.weight", value=poisoned(float("nan"))))
            ),
            r"sampler\['f_q.head.weight'\] holds 1 NaN or infinite value",
        ),  # fmt: skip
        (lambda p: b"", r"is empty \(0 bytes\)"),
        (lambda p: signed({"epoch": 1}), r"it lacks the entries \['sampler', 'optimizer', "),
        (lambda p: bytes(range(256)) * 4, r"is not a checkpoint: it begins with neither"),
        (lambda p: signed({**p, "note": NotATensor()}), r"holds objects other than tensors"),
        (lambda p: signed(two_ranks(p)), r"written by 2 process\(es\) but this run has 1"),
    ],
)
def test_the_message_names_the_file_and_what_is_wrong(tmp_path, family, original, data, message):
    _, payload = original
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes(data(payload))
    with pytest.raises(CheckpointError, match=message) as info:
        trainer(tmp_path, family).resume()
    assert str(path) in str(info.value)
    assert "weights_only" not in str(info.value)  # (torch's hint to unpickle anything)


def two_ranks(payload: dict) -> dict:
    """``payload`` laid out as two torchrun processes write it (a pool and stream per rank)."""
    state = copy.deepcopy(payload)
    rank = {"replay": state.pop("replay"), "generator": state["generator"].clone()}
    return {**state, "world_size": 2, "ranks": [rank, copy.deepcopy(rank)]}


def test_the_cli_refuses_a_bad_checkpoint_with_exit_2_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / CHECKPOINT_NAME).write_bytes(signed([1, 2]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train_meta.py"), "--config", str(CONFIG), "--run-dir",
         str(run_dir), "--resume", "train.epochs=2", "progress=false"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"error: cannot resume from {run_dir / CHECKPOINT_NAME}: it holds a list" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_write_killed_before_its_rename_leaves_a_file_the_next_run_removes(tmp_path, family):
    # A child process writes a checkpoint and is killed while the temporary file is open.
    path = tmp_path / CHECKPOINT_NAME
    code = (
        "import os, sys, time; from metasampler.files import save_checksummed; "
        "os.fsync = lambda fd: (print('writing', flush=True), time.sleep(60)); "
        "save_checksummed(sys.argv[1], {'epoch': 1})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, env=env
    )
    assert child.stdout.readline().strip() == b"writing"
    child.send_signal(signal.SIGKILL)
    child.wait()
    (left,) = tmp_path.glob(f".{CHECKPOINT_NAME}.*.tmp")
    assert not path.exists()
    # A temporary file of a write still running (this process) is not touched.
    mine = tmp_path / f".{CHECKPOINT_NAME}.{owner_tag()}.tmp"
    mine.write_bytes(b"in progress")
    first = trainer(tmp_path, family)
    first.train()  # the next run: removes the dead write's file, writes its checkpoint
    assert not left.exists() and mine.exists() and path.is_file()
    # Resuming cleans too (here: another killed write, from an earlier release's naming).
    legacy = tmp_path / f".{CHECKPOINT_NAME}.{'0' * 32}.tmp"
    legacy.write_bytes(b"old")
    day_ago = time.time() - 2 * 24 * 3600
    os.utime(legacy, (day_ago, day_ago))
    assert trainer(tmp_path, family).resume() == EPOCHS
    assert not legacy.exists() and mine.exists()


def test_save_checksummed_leaves_no_temporary_file(tmp_path):
    save_checksummed(tmp_path / "x.pt", {"a": torch.ones(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pt"]
