"""Bayesian GRU on polyphonic music: Bach chorales, transfer to Palestrina (Gong et al. 2019,
§5.4, appendix F.4).

Task kind ``chorale_gru`` (``TaskConfig.kind``), built by :func:`build_chorale_problem`
(dispatched from ``tasks.bnn.build_bnn_problem``). The paper trains the sampler on a
100-unit GRU (Piano-midi) and tests on 200-unit GRUs (Piano, Muse, Nottingham, JSB); here the
training task is a 100-unit GRU on Bach chorales (``task.hidden: [100]``), the NT test task a
200-unit GRU on Bach, and the dataset-transfer task a 200-unit GRU on Palestrina.

**Data** (needs the optional pip package ``music21``, the project's ``music`` extra):

* ``task.dataset: bach``: the ``.mxl`` files of ``music21.corpus.getComposer('bach')`` with
  four parts (the four-part chorales, the source of the JSB set; other files, e.g. chorales
  with an instrumental fifth part, are left out);
* ``task.dataset: palestrina``: :data:`PALESTRINA_PIECES` of the 1,318 ``.krn`` files of
  ``getComposer('palestrina')`` (every ~6.6th file in sorted path order, so every kind of
  mass movement is represented; parsing all 1,318 would take 10-20 minutes).

Each piece becomes an 88-key binary piano roll with **one frame per quarter note** (as the
JSB set): frame ``t`` holds the keys sounding at time ``t`` quarter notes, i.e. notes with
``onset <= t < onset + duration`` (shorter notes between beats are skipped; grace notes
never sound). Key ``k`` is MIDI pitch ``21 + k`` (A0 to C8); pitches outside are dropped.
Rolls are parsed once and cached, bit-packed, as ``.npz`` in ``tasks.data.cache_dir()``
(``$METASAMPLER_CACHE``, default ``~/.cache/metasampler``); the cache key includes the corpus
files' names, sizes and modification times and the music21 version.

With music21 10.5: Bach has 364 four-part chorales (of 408 ``.mxl`` files), 19,817 frames
(24-193 per piece, mean 54), 3.9 keys on per frame; the Palestrina subset has 200 pieces,
72,058 frames (36-1,776 per piece, mean 360), 3.7 keys per frame. Pitches used: MIDI 36-81
(Bach), 41-81 (Palestrina).

**Splits**: pieces (not frames) are split by :func:`tasks.problem.split_indices` with the data
seed: 20% test, 20% validation, the rest training (JSB: 229 / 76 / 77 of 382 pieces).

**Sequences**: every piece is a sequence of frames ``r_0 .. r_{L-1}``; the GRU reads the
previous frame (``x_t = r_{t-1}``, ``x_0 = 0``) and outputs logits of the 88 keys of ``r_t``.
For fixed shapes (one tensor that :func:`torch.func.vmap` handles) the ``(x, y)`` pairs are
cut into chunks of ``task.seq_len`` frames (default 32 = 8 bars of 4/4); the GRU state starts
from zero in every chunk (the first input of a later chunk is still the frame before it) and
the last chunk of a piece is padded with targets ``-1`` (no likelihood, see
:func:`metasampler.bayesian.bernoulli_frame_log_lik`). A datum of the energy is a chunk:
``U(theta) = -sum_chunks sum_frames log p(r_t | r_<t in the chunk, theta) - log p(theta)``,
minibatches of ``task.batch_size`` chunks.

**Metric**: test negative log-likelihood per frame (nats; sum over the 88 keys, mean over
frames) of the chain mixture ``log 1/K sum_k p(r_t | ..., theta_k)`` (see
``metasampler.benchmark``); the paper reports 8.4-8.5 for 200-unit GRUs on JSB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metasampler.splits import ClassificationSplits

from .data import DataUnavailableError, _cached
from .problem import Problem, enum_value, problem_from_splits, split_indices

__all__ = [
    "DATASETS",
    "MUSIC21_INSTALL",
    "N_KEYS",
    "PALESTRINA_PIECES",
    "GRUModel",
    "SequenceData",
    "build_chorale_problem",
    "build_sequence_data",
    "corpus_paths",
    "load_piano_rolls",
    "make_sequences",
    "piano_roll",
]

N_KEYS = 88
LOWEST_MIDI = 21  # A0, key 0 of a piano
DATASETS = ("bach", "palestrina")
PALESTRINA_PIECES = 200
MUSIC21_INSTALL = "pip install music21  (or pip install -e '.[music]')"
_BACH_PARTS = 4  # four-part chorales
_TEST_FRACTION = 0.2
_VAL_FRACTION = 0.2
_CACHE_VERSION = 1  # bump when the parsing rule changes
_EPS = 1e-6  # offsets are music21 fractions; floats may miss an integer by rounding


# --------------------------------------------------------------------------------------------
# Piano rolls
# --------------------------------------------------------------------------------------------
def piano_roll(score: Any, frame: float = 1.0) -> np.ndarray:
    """The binary piano roll ``(T, 88)`` (uint8) of a music21 score or stream.

    Frame ``t`` holds the keys sounding at time ``t * frame`` quarter notes (onset ``<=`` time
    ``<`` onset + duration); ``T = ceil(highestTime / frame)``.
    """
    flat = score.flatten()
    n_frames = int(np.ceil(float(flat.highestTime) / frame - _EPS))
    roll = np.zeros((max(n_frames, 0), N_KEYS), dtype=np.uint8)
    for note in flat.notes:
        onset = float(note.offset) / frame
        end = onset + float(note.quarterLength) / frame
        first, stop = int(np.ceil(onset - _EPS)), int(np.ceil(end - _EPS))
        if stop <= first:
            continue  # grace notes and notes between two frame times
        for pitch in note.pitches:
            key = int(pitch.midi) - LOWEST_MIDI
            if 0 <= key < N_KEYS:
                roll[first:stop, key] = 1
    return roll


def _music21():
    try:
        import music21
    except ImportError:
        raise DataUnavailableError(
            f"the chorale_gru task needs the music21 corpus: {MUSIC21_INSTALL}"
        ) from None
    return music21


def corpus_paths(dataset: str) -> list[Path]:
    """The corpus files parsed for ``dataset`` (``"bach"``: every ``.mxl``; ``"palestrina"``:
    :data:`PALESTRINA_PIECES` evenly spaced files in sorted order), sorted.

    Raises:
        DataUnavailableError: music21 is not installed or has no such corpus.
    """
    if dataset not in DATASETS:
        raise ValueError(f"task.dataset must be one of {DATASETS}, got {dataset!r}")
    music21 = _music21()
    paths = sorted(Path(p) for p in music21.corpus.getComposer(dataset))
    if dataset == "bach":
        paths = [p for p in paths if p.suffix == ".mxl"]
    elif len(paths) > PALESTRINA_PIECES:
        picks = np.linspace(0, len(paths) - 1, PALESTRINA_PIECES).round().astype(int)
        paths = [paths[i] for i in picks]
    if not paths:
        raise DataUnavailableError(f"music21 {music21.__version__} has no {dataset} corpus files")
    return paths


def _parse(paths: list[Path]) -> dict[str, np.ndarray]:
    """Parse every file; unparseable files are skipped (and listed in ``failed``)."""
    from music21 import converter

    rolls, names, parts, failed = [], [], [], []
    for path in paths:
        try:
            score = converter.parse(str(path))
            roll = piano_roll(score)
        except Exception:  # noqa: BLE001  (a corrupt corpus file must not stop the others)
            failed.append(path.name)
            continue
        if len(roll) == 0:
            failed.append(path.name)
            continue
        rolls.append(roll)
        names.append(path.name)
        parts.append(len(getattr(score, "parts", [])) or 1)
    if not rolls:
        raise DataUnavailableError(f"none of the {len(paths)} corpus files could be parsed")
    return {
        "packed": np.packbits(np.concatenate(rolls), axis=-1),  # 11 bytes per frame
        "lengths": np.array([len(r) for r in rolls], dtype=np.int64),
        "names": np.array(names),
        "parts": np.array(parts, dtype=np.int64),
        "failed": np.array(failed, dtype=str),
    }


def load_piano_rolls(dataset: str) -> tuple[list[np.ndarray], list[str]]:
    """The piano rolls ``[(L_i, 88) uint8]`` and file names of ``dataset``, parsed once (Bach:
    0.12 s per file, ~1 minute idle, 4.8 minutes measured on a busy 2-core machine;
    Palestrina subset: ~0.5 s per file, 5.7 minutes busy) and cached (module docstring).

    Raises:
        DataUnavailableError: music21 is missing (the message says how to install it).
    """
    music21 = _music21()
    paths = corpus_paths(dataset)
    h = hashlib.sha1(f"v{_CACHE_VERSION}|music21 {music21.__version__};".encode())
    for p in paths:
        st = p.stat()
        h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns};".encode())
    arrays = _cached(f"{dataset}-rolls-quarter-{h.hexdigest()[:16]}.npz", lambda: _parse(paths))
    frames = np.unpackbits(arrays["packed"], axis=-1, count=N_KEYS)
    bounds = np.cumsum(arrays["lengths"])[:-1]
    rolls, names = np.split(frames, bounds), [str(n) for n in arrays["names"]]
    if dataset == "bach":
        keep = [i for i, n in enumerate(arrays["parts"]) if n == _BACH_PARTS]
        rolls, names = [rolls[i] for i in keep], [names[i] for i in keep]
    return rolls, names


def make_sequences(rolls: Sequence[np.ndarray], seq_len: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets ``(n_chunks, seq_len, 88)`` (float32) of the pieces ``rolls``.

    Targets are the frames, inputs the previous frames (zeros before the first); both are cut
    into chunks of ``seq_len`` frames, the last chunk of a piece padded with input 0 and
    target ``-1``.
    """
    if int(seq_len) < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    xs, ys = [], []
    for roll in rolls:
        roll = np.asarray(roll, dtype=np.float32)
        if roll.ndim != 2 or roll.shape[1] != N_KEYS or len(roll) == 0:
            raise ValueError(f"a piano roll must have shape (L >= 1, {N_KEYS}), got {roll.shape}")
        n_chunks = -(-len(roll) // seq_len)
        pad = n_chunks * seq_len - len(roll)
        x = np.concatenate([np.zeros((1, N_KEYS), np.float32), roll[:-1]])
        x = np.pad(x, ((0, pad), (0, 0)))
        y = np.pad(roll, ((0, pad), (0, 0)), constant_values=-1.0)
        xs.append(x.reshape(n_chunks, seq_len, N_KEYS))
        ys.append(y.reshape(n_chunks, seq_len, N_KEYS))
    if not xs:
        raise ValueError("no pieces to make sequences of")
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------
class GRUModel(nn.Module):
    """A one-layer GRU with a linear read-out: ``(B, T, n_in)`` -> logits ``(B, T, n_out)``.

    The recurrence is written out (the equations and parameter layout of ``torch.nn.GRU``,
    gates ordered r, z, n) so that :func:`torch.func.functional_call` under
    :func:`torch.func.vmap` over parameter sets works; ``nn.GRU``'s fused kernel does not.
    ``reset_parameters`` initialises like ``nn.GRU`` (uniform ``±1/sqrt(hidden)``) for the
    recurrent weights; the read-out is an ``nn.Linear``.
    """

    def __init__(self, hidden: int, n_in: int = N_KEYS, n_out: int = N_KEYS) -> None:
        super().__init__()
        if min(int(hidden), int(n_in), int(n_out)) < 1:
            raise ValueError(f"GRUModel needs positive sizes, got {hidden}, {n_in}, {n_out}")
        self.hidden = int(hidden)
        self.weight_ih = nn.Parameter(torch.empty(3 * self.hidden, int(n_in)))
        self.weight_hh = nn.Parameter(torch.empty(3 * self.hidden, self.hidden))
        self.bias_ih = nn.Parameter(torch.empty(3 * self.hidden))
        self.bias_hh = nn.Parameter(torch.empty(3 * self.hidden))
        self.readout = nn.Linear(self.hidden, int(n_out))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.GRU``'s initialisation of the recurrent weights (the read-out resets itself)."""
        bound = 1.0 / self.hidden**0.5
        for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, T, n_out)`` for inputs ``(B, T, n_in)``; the state starts at zero."""
        two = 2 * self.hidden
        # Input gates of all time steps at once; unbind, not x[:, t]: the backward of T
        # selections would add T full-size zero tensors (quadratic in T).
        gates_x = F.linear(x, self.weight_ih, self.bias_ih).unbind(1)
        h = x.new_zeros(x.shape[0], self.hidden)
        states = []
        for gx in gates_x:
            gh = F.linear(h, self.weight_hh, self.bias_hh)
            r, z = torch.sigmoid(gx[..., :two] + gh[..., :two]).chunk(2, dim=-1)
            n = torch.tanh(gx[..., two:] + r * gh[..., two:])
            h = n + z * (h - n)  # (1 - z) * n + z * h
            states.append(h)
        return self.readout(torch.stack(states, dim=1))


# --------------------------------------------------------------------------------------------
# Data splits and the problem
# --------------------------------------------------------------------------------------------
@dataclass
class SequenceData(ClassificationSplits):
    """Splits and architecture of a sequence task: the fields of
    ``metasampler.splits.ClassificationSplits`` that the benchmark reads, and more.

    Attributes:
        x_train, y_train, x_val, y_val, x_test, y_test: inputs and targets
            ``(n_chunks, seq_len, 88)``; padding frames have targets ``-1``.
        n_classes: 88 (keys per frame).
        ood_x: ``None`` (no out-of-distribution set).
        name: a short label.
        model: the :class:`GRUModel` (its parameter values are not used: they are ``theta``).
        input_shape: ``(seq_len, 88)``.
        dataset: ``"bach"``, ``"palestrina"`` or ``"custom"``.
        pieces: pieces per split; frames: real (unpadded) frames per split.
    """

    dataset: str = "custom"
    pieces: dict[str, int] = field(default_factory=dict)
    frames: dict[str, int] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        """Number of chunks per split."""
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}


def build_sequence_data(
    cfg: Any,
    seed: int | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    rolls: Sequence[np.ndarray] | None = None,
) -> SequenceData:
    """The splits and GRU of a ``chorale_gru`` task config (module docstring).

    Args:
        cfg: a ``TaskConfig`` (``hidden: [H]``, ``dataset``, ``seq_len``, ``seed``).
        seed: data-split seed (default ``cfg.seed``); also seeds the module's unused weights.
        rolls: piano rolls ``(L_i, 88)`` to use instead of the music21 corpus (tests).

    Raises:
        ValueError: more than one hidden width, an unknown dataset, or fewer than 3 pieces.
        DataUnavailableError: music21 is missing.
    """
    seed = int(cfg.seed if seed is None else seed)
    hidden = [int(h) for h in cfg.hidden]
    if len(hidden) != 1:
        raise ValueError(f"chorale_gru has one GRU layer: task.hidden must be [H], got {hidden}")
    seq_len = int(cfg.seq_len)
    if rolls is None:
        dataset = str(enum_value(cfg.dataset))
        rolls, _ = load_piano_rolls(dataset)
    else:
        dataset = "custom"
    n = len(rolls)
    if n < 3:
        raise ValueError(f"need at least 3 pieces to split into train/val/test, got {n}")
    n_test, n_val = max(1, round(_TEST_FRACTION * n)), max(1, round(_VAL_FRACTION * n))
    split = dict(zip(("train", "val", "test"), split_indices(n, n_val, n_test, seed), strict=True))
    tensors: dict[str, Tensor] = {}
    for part, idx in split.items():
        x, y = make_sequences([rolls[i] for i in idx], seq_len)
        tensors[f"x_{part}"] = x.to(device=device, dtype=dtype)
        tensors[f"y_{part}"] = y.to(device=device, dtype=dtype)
    with torch.random.fork_rng(devices=[]):  # the module's own weights: seeded, no side effect
        torch.manual_seed(seed)
        model = GRUModel(hidden[0]).to(device=device, dtype=dtype)
    frames = {part: int(sum(len(rolls[i]) for i in idx)) for part, idx in split.items()}
    return SequenceData(
        **tensors,
        n_classes=N_KEYS,
        ood_x=None,
        name=(
            f"chorale_gru(GRU {hidden[0]}, {dataset}, {n} pieces, {frames['train']} train frames"
            f", chunks of {seq_len}, seed={seed})"
        ),
        model=model,
        input_shape=(seq_len, N_KEYS),
        dataset=dataset,
        pieces={part: len(idx) for part, idx in split.items()},
        frames=frames,
    )


def build_chorale_problem(
    cfg: Any,
    seed: int | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    rolls: Sequence[np.ndarray] | None = None,
) -> Problem:
    """A :class:`tasks.problem.Problem` for a ``chorale_gru`` task config.

    ``target``: :class:`metasampler.BayesianModel` of the GRU on the training chunks
    (``"bernoulli_sequence"`` likelihood, ``prior_std = cfg.prior_std``, minibatches of
    ``cfg.batch_size`` chunks); ``init``: PyTorch-style initialisations of the GRU
    (``init_positions(scheme="module")``); ``exact``: ``None``; ``data``: the
    :class:`SequenceData`. ``rolls`` replaces the corpus (tests).

    Raises:
        ValueError: a bad config (see :func:`build_sequence_data`) or a batch size larger
            than the number of training chunks.
        DataUnavailableError: music21 is missing.
    """
    data = build_sequence_data(cfg, seed=seed, device=device, dtype=dtype, rolls=rolls)
    return problem_from_splits(
        data, cfg, "bernoulli_sequence", unit="chunks", device=device, dtype=dtype
    )
