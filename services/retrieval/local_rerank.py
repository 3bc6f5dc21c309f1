"""A local cross-encoder reranker: an ONNX graph and a ``tokenizer.json`` from RERANK_MODEL_PATH.

Nothing is downloaded: the operator provides the files (docs/architecture.md §18), in the Hugging Face /
Optimum export layout (``model.onnx`` or ``onnx/model.onnx`` next to ``tokenizer.json``).
The model is loaded and run once at start-up, so a bad directory stops the service there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from services.common.settings import SettingsError
from services.retrieval.intra_op import usable_cpus
from services.retrieval.rerank import (
    Reranker,
    RerankError,
    RerankResult,
    RerankSettings,
    local_model_files,
)

log = logging.getLogger(__name__)

_INT_TYPES: dict[str, type[np.integer[Any]]] = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
_FEEDS = ("input_ids", "attention_mask", "token_type_ids")
_PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")
# tokenizer_config.json says 1e30 (VERY_LARGE_INTEGER) when the model states no limit.
_NO_LIMIT = 1_000_000


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # tanh form: no overflow warning for large |x|, unlike 1 / (1 + exp(-x)).
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)), dtype=np.float64)


def _stated_limit(tokenizer: Tokenizer, root: Path) -> int | None:
    """The model's own length limit: tokenizer.json's truncation, or tokenizer_config.json's
    ``model_max_length``; None when neither states one."""
    limits = []
    if tokenizer.truncation:
        limits.append(int(tokenizer.truncation["max_length"]))
    config = root / "tokenizer_config.json"
    if config.is_file():
        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("model_max_length")
        except (OSError, ValueError, AttributeError) as exc:
            raise SettingsError(f"{config}: not a readable tokenizer config ({exc})") from None
        if isinstance(value, int | float) and 0 < value < _NO_LIMIT:
            limits.append(int(value))
    return min(limits) if limits else None


def _pad_token(tokenizer: Tokenizer) -> tuple[int, str]:
    if tokenizer.padding:
        return int(tokenizer.padding["pad_id"]), str(tokenizer.padding["pad_token"])
    for token in _PAD_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found, token
    return 0, "[PAD]"


class _Call:
    """One rerank call's cancellation: the flag the batch loop checks and ORT's terminate."""

    def __init__(self) -> None:
        self.options = ort.RunOptions()
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        self.options.terminate = True  # ends a session.run in progress on the worker thread


class _Stopped(Exception):
    """The call was given up (timeout or cancellation) before its batches were done."""


class LocalCrossEncoder(Reranker):
    """A :class:`~services.retrieval.rerank.Reranker` running a cross-encoder in-process.

    Each (query, passage) pair goes through the tokenizer's pair template (``[CLS] q [SEP]
    p [SEP]`` for BERT-style models), truncated longest-first to ``max_length`` and padded
    per batch; the score is the sigmoid of the graph's relevance logit, in [0, 1] like the
    HTTP API's. One call runs at a time, in a worker thread with ``threads`` intra-op
    threads: a second search waits for it (within its timeout) instead of oversubscribing
    the cores the searches themselves need.
    """

    def __init__(self, settings: RerankSettings) -> None:
        """Load and test-run the model; :class:`SettingsError` naming the file when it is
        missing, unreadable, or not a cross-encoder this class can feed."""
        if not settings.model_path:
            raise ValueError("LocalCrossEncoder needs RerankSettings.model_path")
        self._settings = settings
        graph, tokenizer_file = local_model_files(settings.model_path, settings.model_file)
        self.model_file = graph
        """The ONNX graph loaded."""
        self.threads = settings.threads or max(1, usable_cpus() // 2)
        """Intra-op threads of one call."""
        self._tokenizer = self._load_tokenizer(tokenizer_file)
        limit = _stated_limit(self._tokenizer, Path(settings.model_path))
        self._session = self._load_session(graph)
        self._feeds = self._check_inputs(graph)
        ids = next(i for i in self._session.get_inputs() if i.name == "input_ids")
        fixed = ids.shape[1]  # an int when the export fixed the sequence length
        fixed_length = fixed if isinstance(fixed, int) and fixed > 0 else None
        self.max_length = min(
            n for n in (settings.max_length, limit, fixed_length) if n is not None
        )
        """Tokens per pair after truncation, specials included."""
        self._output = self._pick_output(graph)
        pad_id, pad_token = _pad_token(self._tokenizer)
        self._tokenizer.enable_truncation(self.max_length, strategy="longest_first")
        # Pad to the longest pair of each batch (or to the graph's fixed length).
        self._tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token, length=fixed_length)
        self._slot = asyncio.Semaphore(1)
        try:
            self._score_sync("start-up check", ["a passage"], _Call())
        except RerankError as exc:
            raise SettingsError(f"{graph}: the model does not run: {exc}") from None
        log.info(
            "local reranker loaded",
            extra={"model": str(graph), "max_length": self.max_length, "threads": self.threads,
                   "inputs": ",".join(self._feeds)},
        )  # fmt: skip

    # -- loading ----------------------------------------------------------------------------

    @staticmethod
    def _load_tokenizer(path: Path) -> Tokenizer:
        try:
            return Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise SettingsError(f"{path}: not a tokenizers tokenizer.json ({exc})") from None

    def _load_session(self, path: Path) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        # ORT's pool threads spin after each run by default: they would take the cores the
        # searches' own threads (embedding, Edge) need between reranks.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT's pybind errors (InvalidProtobuf, Fail, ...)
            raise SettingsError(f"{path}: cannot load the ONNX model ({exc})") from None

    def _check_inputs(self, path: Path) -> dict[str, type[np.integer[Any]]]:
        """The inputs to feed, each with the integer type the graph wants."""
        inputs = {i.name: i for i in self._session.get_inputs()}
        if "input_ids" not in inputs:
            raise SettingsError(
                f"{path}: the graph has no input_ids input (inputs: {sorted(inputs)}); "
                "expected a cross-encoder exported for sequence classification"
            )
        unknown = sorted(set(inputs) - set(_FEEDS))
        if unknown:
            raise SettingsError(
                f"{path}: the graph wants inputs this reranker cannot feed: {unknown}"
            )
        feeds = {}
        for name in (n for n in _FEEDS if n in inputs):
            arg = inputs[name]
            if arg.type not in _INT_TYPES or len(arg.shape) != 2:
                raise SettingsError(
                    f"{path}: input {name} is {arg.type} {arg.shape}, expected an int64 or "
                    "int32 [batch, sequence] tensor"
                )
            feeds[name] = _INT_TYPES[arg.type]
        return feeds

    def _pick_output(self, path: Path) -> str:
        outputs = self._session.get_outputs()
        named = [o for o in outputs if o.name == "logits"]
        out = named[0] if named else outputs[0]
        shape = out.shape
        last = shape[-1] if shape else None
        if len(shape) not in (1, 2) or (len(shape) == 2 and isinstance(last, int) and last > 2):
            raise SettingsError(
                f"{path}: no logits output: {out.name} has shape {shape}, expected "
                "[batch], [batch, 1] or [batch, 2] (is this an embedding model?)"
            )
        return str(out.name)

    # -- scoring ----------------------------------------------------------------------------

    async def _score(
        self, query: str, texts: list[str], limit: int, budget: float
    ) -> list[RerankResult]:
        """The budget covers the wait for a running call; ``bad_response`` when the model
        fails on this input."""
        scores = await self._run(query, texts, budget)
        return [RerankResult(i, float(s)) for i, s in enumerate(scores)]

    async def _run(self, query: str, texts: list[str], budget: float) -> np.ndarray:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        try:
            async with asyncio.timeout_at(deadline):
                await self._slot.acquire()
        except TimeoutError:
            raise RerankError(
                "timeout", "the local reranker stayed busy past the timeout"
            ) from None
        call = _Call()
        try:
            work = asyncio.ensure_future(asyncio.to_thread(self._score_sync, query, texts, call))
        except BaseException:
            self._slot.release()
            raise
        # The slot frees when the thread is done, not when a caller stops waiting: a call
        # given up still holds the model until its current batch ends.
        work.add_done_callback(self._finished)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(work)
        except TimeoutError:
            call.stop()
            raise RerankError("timeout", "the local reranker did not finish in time") from None
        except BaseException:  # the search was cancelled: stop the work it asked for
            call.stop()
            raise

    def _finished(self, work: asyncio.Future[np.ndarray]) -> None:
        self._slot.release()
        if not work.cancelled():
            work.exception()  # retrieved: a given-up call's error is not logged as unhandled

    def _score_sync(self, query: str, texts: list[str], call: _Call) -> np.ndarray:
        """Scores of ``texts`` in input order (worker thread)."""
        size = self._settings.batch_size
        parts = []
        for start in range(0, len(texts), size):
            if call.stopped:
                raise _Stopped
            batch = texts[start : start + size]
            try:
                # _fast: no character offsets, which scoring does not need (~40% less time).
                encodings = self._tokenizer.encode_batch_fast([(query, text) for text in batch])
                logits = self._session.run([self._output], self._inputs(encodings), call.options)[0]
            except Exception as exc:  # tokenizers' and ORT's own exception types
                if call.stopped:
                    raise _Stopped from None
                raise RerankError("bad_response", f"the model failed: {exc}") from None
            parts.append(self._scores(np.asarray(logits), len(batch)))
        return np.concatenate(parts)

    def _inputs(self, encodings: list[Encoding]) -> dict[str, np.ndarray]:
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        return {name: np.array(columns[name], dtype=t) for name, t in self._feeds.items()}

    @staticmethod
    def _scores(logits: np.ndarray, n: int) -> np.ndarray:
        if logits.ndim == 2 and logits.shape == (n, 2):
            # Two classes: P(relevant) is softmax's positive column, sigmoid(l1 - l0).
            logit = logits[:, 1] - logits[:, 0]
        elif logits.shape in ((n,), (n, 1)):
            logit = logits.reshape(n)
        else:
            raise RerankError("bad_response", f"logits of shape {logits.shape} for {n} pairs")
        values = logit.astype(np.float64)
        if not np.isfinite(values).all():
            raise RerankError("bad_response", "the model returned a non-finite logit")
        return _sigmoid(values)
