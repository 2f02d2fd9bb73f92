"""Device presets for `moss-vl serve`: the SGLang flags and environment per device.

DESIGN.md §4 as data (`PRESETS`) plus one pure function, `build_command`, that
turns a typed `ServeConfig` into the argument list for
`python -m moss_vl.launch_server` (SGLang's launcher with the plugins loaded in
every process it spawns) and the environment it needs. Contradictions
raise `PresetError`, which names the offending flag and the reason; the CLI
turns it into exit code 2.

Flag names are SGLang 0.5.23's (`sglang.srt.server_args.ServerArgs.add_cli_args`);
tests parse every preset with that real parser. Two names differ from older
SGLang docs: `--tp` is spelled `--tp-size`, and `--cuda-graph-bs` no longer
exists (0.5.23 splits it into `--cuda-graph-bs-decode` / `--cuda-graph-bs-prefill`;
the bare spelling is an ambiguous prefix there and argparse rejects it).

This module imports neither torch nor sglang.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from moss_vl import sglang_versions
from moss_vl.environ import hook_names_of

SGLANG_VERSION = sglang_versions.PINNED
# SGLang's own launcher, run by a module that loads the plugins first in every
# process SGLang spawns (HTTP workers included): moss_vl/launch_server.py.
LAUNCH_MODULE = "moss_vl.launch_server"
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 30000
HEALTH_PATH = "/health"
PLUGIN_NAME = "moss_vl"
DEVICES = ("cuda", "npu")

# The npu preset keeps graphs for these decode batch sizes (upstream's
# `--cuda-graph-bs 1 2 4 8 16 32`, which 0.5.23 names `--cuda-graph-bs-decode`).
NPU_CUDA_GRAPH_BS = (1, 2, 4, 8, 16, 32)

# Values whose text must never be printed, nor put on a command line: every
# process's argv is readable from /proc/<pid>/cmdline by anyone on the node.
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})
MASK = "****"
# SGLang (0.5.23 and 0.5.17) merges the keys of a `--config FILE` YAML into its
# arguments in-process (server_args_config_parser.ConfigArgumentMerger), so the
# keys travel in a file and only its path is on argv.
CONFIG_FLAG = "--config"


class PresetError(ValueError):
    """A serve request that cannot start: `flag` is what to change, `reason` why."""

    def __init__(self, flag: str, reason: str):
        super().__init__(f"{flag}: {reason}")
        self.flag = flag
        self.reason = reason


@dataclass(frozen=True)
class Preset:
    device: str
    # (flag, values) in the order they are emitted; a flag with no values is a switch.
    flags: tuple[tuple[str, tuple[str, ...]], ...]
    env: Mapping[str, str]


# Always on, whatever the device: MOSS-VL ships remote code (auto_map), it is
# multimodal, and /metrics carries sglang:* next to the plugin's moss_vl:*.
COMMON_FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--trust-remote-code", ()),
    ("--enable-multimodal", ()),
    ("--enable-metrics", ()),
)

# Where SGLang 0.5.23's HTTP workers (--tokenizer-worker-num > 1) import the app
# from: moss_vl.http_app loads the plugin first (its docstring says why).
HTTP_APP_ENV = {"SGLANG_HTTP_SERVER_APP_PATH": "moss_vl.http_app:app"}

# With more than one HTTP worker, SGLang runs uvicorn's supervisor, which pings every
# worker and kills and respawns one that has not answered within this many seconds
# (SGLang's default: 10). A spawned worker answers only once its bootstrap is done
# (SGLang's imports, the plugin load): 28-31 s on the H200's host with 8 starting at
# once, so 1-2 of the preset's 8 were killed and restarted at each full-scale start,
# /health answered before they were back, and they took their first requests cold
# (docs/e2e.md, run of 2026-12-02 14:28). 120 s is four times that bootstrap; a
# worker whose pong thread is stuck that long is hung anyway. An operator's value
# stands.
WORKER_HEALTHCHECK_ENV = "SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT"
WORKER_HEALTHCHECK_TIMEOUT_S = 120

PRESETS: dict[str, Preset] = {
    "cuda": Preset(
        device="cuda",
        flags=(
            # The cross-attention mask (ForwardBatch.cross_attention_custom_mask)
            # is consumed by FlashInfer's prefill kernels only.
            ("--prefill-attention-backend", ("flashinfer",)),
        ),
        env={"SGLANG_PLUGINS": PLUGIN_NAME, **HTTP_APP_ENV},
    ),
    "npu": Preset(
        device="npu",
        flags=(
            ("--device", ("npu",)),
            ("--attention-backend", ("ascend",)),
            ("--prefill-attention-backend", ("ascend",)),
            ("--decode-attention-backend", ("ascend",)),
            ("--sampling-backend", ("ascend",)),
            ("--mm-attention-backend", ("ascend_attn",)),
            # Paged KV (page 128) keeps finished requests' vision pages in the
            # radix tree and made T=0 decoding non-deterministic upstream.
            ("--disable-radix-cache", ()),
            ("--cuda-graph-bs-decode", tuple(str(b) for b in NPU_CUDA_GRAPH_BS)),
        ),
        # The fused FA / FIA operators cannot take the cross-attention mask;
        # with both off, AscendAttnBackend takes the native SDPA path the plugin patches.
        env={"SGLANG_PLUGINS": PLUGIN_NAME, **HTTP_APP_ENV,
             "ASCEND_USE_FA": "false", "ASCEND_USE_FIA": "false"},
    ),
}

# Other spellings SGLang 0.5.23 accepts for a flag moss-vl emits or checks
# (aliases from its dataclass fields, plus `--tp`, the abbreviation every
# SGLang example uses).
ALIASES: dict[str, str] = {
    "--model": "--model-path",
    "--tp": "--tp-size",
    "--tensor-parallel-size": "--tp-size",
    "--enable-hicache": "--enable-hierarchical-cache",
    "--attention-context-parallel-size": "--attn-cp-size",
}

# The cuda preset's --tokenizer-worker-num: one HTTP/tokenizer process per
# CPUS_PER_TOKENIZER_WORKER CPUs the server may use, at most
# MAX_TOKENIZER_WORKERS. With SGLang's one process a request's image and video
# processing queues behind every other's; 8 on the H200's 16 cores took 64-frame
# video TTFT at concurrency 8 from 14.2 s to 3.5 s (docs/e2e.md, 2026-12-02). The
# npu preset keeps SGLang's one (not measured on Ascend).
MAX_TOKENIZER_WORKERS = 8
CPUS_PER_TOKENIZER_WORKER = 2


# Serving modes that take one tokenizer process (SGLang refuses more, or has no
# HTTP workers): with one of these flags the preset leaves the count at one.
SINGLE_TOKENIZER_FLAGS: dict[str, str] = {
    "--grpc-port": "SGLang's native gRPC server takes one tokenizer process",
    "--smg-grpc-mode": "the gRPC server has no HTTP workers",
    "--grpc-mode": "the gRPC server has no HTTP workers",
    "--use-ray": "the Ray launch path runs its own HTTP server",
    "--encoder-only": "an encoder-only server has its own HTTP server",
    "--max-ep-size": "Elastic EP scale-up requires one tokenizer process",
}


def auto_tokenizer_workers(device: str, cpus: int | None) -> int:
    """The preset's tokenizer worker count for ``cpus`` usable CPUs (None: unknown, 1)."""
    if device != "cuda" or not cpus:
        return 1
    return max(1, min(MAX_TOKENIZER_WORKERS, cpus // CPUS_PER_TOKENIZER_WORKER))


# Flags that switch the radix cache back on (or need it) in SGLang 0.5.23.
RADIX_CACHE_FLAGS: dict[str, str] = {
    "--enable-hierarchical-cache": "the hierarchical cache is a tier of the radix cache",
    "--enable-session-radix-cache": "it tracks sessions in the radix cache",
    "--radix-cache-backend": "it selects a radix cache implementation",
    "--disaggregation-decode-enable-radix-cache": "it sets disable_radix_cache=False",
    "--enable-unified-cache-external-linker": "it requires radix caching enabled",
}
# Flags that send MOSS-VL's cross-attention to an Ascend kernel without a mask
# input (AscendAttnBackend.forward_extend; the plugin refuses them too).
NPU_UNMASKABLE_FLAGS: dict[str, str] = {
    "--speculative-algorithm": "speculative decoding runs the fused MTP kernels",
    "--attn-cp-size": "context parallelism runs the FIA kernels",
    "--dllm-algorithm": "diffusion-LLM decoding runs its own attention",
}
NPU_RADIX_REASON = (
    "the npu preset runs with --disable-radix-cache: under paged KV (page 128) the radix "
    "tree keeps finished requests' vision pages and T=0 decoding became non-deterministic "
    "upstream"
)

# Flags moss-vl reads or validates; an abbreviation of one of these in the
# extra arguments would slip past the checks (argparse expands unique
# prefixes), so abbreviations of them are refused.
GUARDED_FLAGS: frozenset[str] = frozenset(
    {flag for preset in PRESETS.values() for flag, _ in preset.flags}
    | {flag for flag, _ in COMMON_FLAGS}
    | set(RADIX_CACHE_FLAGS)
    | set(NPU_UNMASKABLE_FLAGS)
    | {
        "--model-path",
        "--served-model-name",
        "--host",
        "--port",
        "--tp-size",
        "--pp-size",
        "--dp-size",
        "--nnodes",
        "--dtype",
        "--mem-fraction-static",
        "--context-length",
        "--max-running-requests",
        "--api-key",
        "--admin-api-key",
        "--config",
    }
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_FLAG = re.compile(r"^--?[A-Za-z]")


@dataclass(frozen=True)
class ServeConfig:
    """What `moss-vl serve` was asked for (flags over MOSS_VL_* variables)."""

    device: str
    model_path: str | None
    served_model_name: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tp: int | None = None
    dtype: str = "bfloat16"
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None
    api_key: str | None = None
    admin_api_key: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass
class _Option:
    flag: str  # canonical spelling
    values: list[str] = field(default_factory=list)
    inline: bool = False  # written as --flag=value


@dataclass(frozen=True)
class ServeCommand:
    device: str
    argv: tuple[str, ...]  # arguments after `python -m moss_vl.launch_server`: SGLang's
    env: dict[str, str]  # variables moss-vl sets on top of the inherited environment
    model_path: str = ""
    warnings: tuple[str, ...] = ()  # what a preview let through (e.g. a path of the pod)
    # SGLang config keys (`api-key`, `admin-api-key`) that go into the --config
    # file, never onto argv; empty when the server runs without keys.
    secret_config: dict[str, str] = field(default_factory=dict, repr=False)

    def launch_argv(self, python: str, config_path: str | None = None) -> list[str]:
        if self.secret_config and not config_path:
            raise ValueError("this command carries keys: write them with write_secret_config")
        config = [CONFIG_FLAG, config_path] if self.secret_config else []
        return [python, "-m", LAUNCH_MODULE, *self.argv, *config]

    def display_argv(self) -> list[str]:
        return mask_secrets(self.argv)


def mask_secrets(argv: Sequence[str]) -> list[str]:
    """argv with the values of SECRET_FLAGS replaced by MASK."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        name, sep, _ = token.partition("=")
        if ALIASES.get(name, name) in SECRET_FLAGS:
            if sep:
                out.append(f"{name}={MASK}")
            else:
                out.append(token)
                hide_next = True
            continue
        out.append(token)
    return out


def parse_extra_args(tokens: Sequence[str]) -> list[_Option]:
    """Group SGLang arguments into options: a flag and the values after it."""
    options: list[_Option] = []
    for token in tokens:
        if _FLAG.match(token):
            name, sep, value = token.partition("=")
            if name.startswith("--"):
                _refuse_abbreviation(name)
            option = _Option(ALIASES.get(name, name), [value] if sep else [], bool(sep))
            options.append(option)
        elif not options:
            raise PresetError(
                token, "extra SGLang arguments must start with a flag (--name [value ...])"
            )
        else:
            options[-1].values.append(token)
    return options


def _refuse_abbreviation(name: str) -> None:
    if name in GUARDED_FLAGS or name in ALIASES:
        return
    expansions = sorted(f for f in GUARDED_FLAGS if f.startswith(name))
    if expansions:
        raise PresetError(
            name,
            f"abbreviated flag; write it out ({', '.join(expansions)}) so moss-vl can check it",
        )


def is_hub_id(model_path: str) -> bool:
    return bool(_HUB_ID.match(model_path)) and ".." not in model_path.split("/")


def check_model_path(model_path: str | None, preview: bool = False) -> str | None:
    """Refuse a model path that cannot be served; in a preview, a missing local
    path is only a warning (returned): it may be a path of the pod, not of this
    machine."""
    if not model_path:
        raise PresetError(
            "--model-path", "required (a local checkpoint directory or a hub id like org/name)"
        )
    if os.path.exists(model_path):
        return None
    if is_hub_id(model_path):
        return None
    if preview:
        return (
            f"--model-path {model_path!r} does not exist on this machine; previewing anyway "
            "(it must exist where the server starts, e.g. in the pod)"
        )
    raise PresetError(
        "--model-path",
        f"{model_path!r} does not exist locally and is not a hub id (org/name)",
    )


def check_checkpoint(model_path: str) -> None:
    """Before a real start: a local model path must be a checkpoint directory.

    SGLang would fail minutes later, deep in transformers, on an empty
    directory (a download that never ran) or a file; this says it in one line.
    A hub id (not a local path) is left to SGLang.
    """
    if not os.path.exists(model_path):
        return
    if not os.path.isdir(model_path):
        raise PresetError(
            "--model-path",
            f"{model_path!r} is a file; expected a checkpoint directory (config.json and weights)",
        )
    entries = os.listdir(model_path)
    if not entries:
        raise PresetError(
            "--model-path",
            f"{model_path!r} is an empty directory: the weights are not there "
            "(did the download run?)",
        )
    if "config.json" not in entries:
        raise PresetError(
            "--model-path",
            f"{model_path!r} has no config.json: not a Hugging Face checkpoint directory",
        )


def _check_config(config: ServeConfig) -> None:
    if config.device not in PRESETS:
        raise PresetError("--device", f"{config.device!r}: expected one of {', '.join(DEVICES)}")
    if not 1 <= config.port <= 65535:
        raise PresetError("--port", f"{config.port} is not a TCP port (1-65535)")
    if not config.host:
        raise PresetError("--host", "must not be empty")
    if config.tp is not None and config.tp < 1:
        raise PresetError("--tp", f"{config.tp}: must be at least 1")
    if config.mem_fraction_static is not None and not 0 < config.mem_fraction_static <= 1:
        raise PresetError(
            "--mem-fraction-static", f"{config.mem_fraction_static}: must be in (0, 1]"
        )
    for flag, value in (
        ("--context-length", config.context_length),
        ("--max-running-requests", config.max_running_requests),
    ):
        if value is not None and value < 1:
            raise PresetError(flag, f"{value}: must be at least 1")
    graph_bs = config.cuda_graph_bs
    if graph_bs is not None and (not graph_bs or any(b < 1 for b in graph_bs)):
        raise PresetError("--cuda-graph-bs", f"{list(graph_bs)}: batch sizes must be >= 1")


def _preset_options(config: ServeConfig, tp: int, tokenizer_workers: int = 1) -> list[_Option]:
    preset = PRESETS[config.device]
    options = [_Option("--model-path", [config.model_path or ""])]
    if config.served_model_name:
        options.append(_Option("--served-model-name", [config.served_model_name]))
    options += [
        _Option("--host", [config.host]),
        _Option("--port", [str(config.port)]),
        _Option("--tp-size", [str(tp)]),
        _Option("--dtype", [config.dtype]),
    ]
    options += [_Option(flag, list(values)) for flag, values in COMMON_FLAGS]
    options += [_Option(flag, list(values)) for flag, values in preset.flags]
    if config.cuda_graph_bs is not None:
        options.append(_Option("--cuda-graph-bs-decode", [str(b) for b in config.cuda_graph_bs]))
    if config.mem_fraction_static is not None:
        options.append(_Option("--mem-fraction-static", [str(config.mem_fraction_static)]))
    if config.context_length is not None:
        options.append(_Option("--context-length", [str(config.context_length)]))
    if config.max_running_requests is not None:
        options.append(_Option("--max-running-requests", [str(config.max_running_requests)]))
    if tokenizer_workers > 1:
        options.append(_Option("--tokenizer-worker-num", [str(tokenizer_workers)]))
    return options


def merge_options(base: list[_Option], extra: list[_Option]) -> list[_Option]:
    """base with each extra option replacing the same flag in place, or appended.

    One flag appears once in the result: a repeated flag takes its last value,
    as argparse would, but the command stays readable.
    """
    merged = list(base)
    index = {opt.flag: i for i, opt in enumerate(merged)}
    for opt in extra:
        if opt.flag in index:
            merged[index[opt.flag]] = opt
        else:
            index[opt.flag] = len(merged)
            merged.append(opt)
    return merged


def _single_value(options: dict[str, _Option], flag: str) -> str | None:
    opt = options.get(flag)
    if opt is None:
        return None
    if len(opt.values) != 1:
        raise PresetError(flag, f"expects one value, got {len(opt.values)}: {opt.values}")
    return opt.values[0]


def _int_value(options: dict[str, _Option], flag: str, default: int) -> int:
    raw = _single_value(options, flag)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise PresetError(flag, f"{raw!r} is not an integer") from None


def _http_workers(options: dict[str, _Option]) -> int:
    """SGLang's HTTP/tokenizer processes under these options (its default: one)."""
    return _int_value(options, "--tokenizer-worker-num", 1)


# The lines whose HTTP workers import SGLANG_HTTP_SERVER_APP_PATH (moss_vl.http_app),
# where the plugin enforces the API key in every tokenizer worker.
KEYED_WORKER_LINES = (sglang_versions.SGLANG_0_5_23,)
KEYED_WORKERS_HOOK = "http_server.keyed_tokenizer_workers"
# build_command's default: the SGLang installed here, looked up only by a check that needs it.
INSTALLED_SGLANG = object()


def _keyed_workers_problem(environ: Mapping[str, str], sglang_version: str | None) -> str | None:
    """Why more than one tokenizer worker would serve without the API key, or None."""
    plugins = environ.get("SGLANG_PLUGINS", "").strip()
    if plugins and PLUGIN_NAME not in {p.strip() for p in plugins.split(",")}:
        return (
            f"SGLANG_PLUGINS={plugins} leaves the moss_vl plugin out, and SGLang enforces the "
            "API key only with one tokenizer worker"
        )
    if KEYED_WORKERS_HOOK in hook_names_of(environ.get("MOSS_VL_DISABLE_HOOKS", "")):
        return (
            f"MOSS_VL_DISABLE_HOOKS turns off {KEYED_WORKERS_HOOK}, without which SGLang's HTTP "
            "workers refuse to start with an API key"
        )
    if sglang_version is None:
        return (
            "SGLang is not installed here, so whether its HTTP workers load moss_vl.http_app "
            f"(which enforces the key in them) cannot be told; they do on "
            f"{', '.join(str(line) for line in KEYED_WORKER_LINES)}"
        )
    if not any(sglang_version in line for line in KEYED_WORKER_LINES):
        return (
            f"SGLang {sglang_version} enforces the API key only with one tokenizer worker and "
            "its HTTP workers do not load moss_vl.http_app, so with more every endpoint would "
            f"answer without a key (the plugin enforces it on "
            f"{', '.join(str(line) for line in KEYED_WORKER_LINES)})"
        )
    return None


def _check_merged(
    device: str,
    options: dict[str, _Option],
    visible: int | None,
    visible_source: str,
    environ: Mapping[str, str],
    preview: bool = False,
    keyed: bool = False,
    sglang_version: str | None | object = INSTALLED_SGLANG,
) -> list[str]:
    warnings: list[str] = []
    if "--config" in options:
        raise PresetError(
            "--config",
            "a config file would bypass the preset checks; pass its flags after `--` instead",
        )
    for flag in sorted(SECRET_FLAGS & options.keys()):
        raise PresetError(
            flag,
            "a key on the command line is readable by every process on the node "
            "(/proc/<pid>/cmdline); give it as a file: MOSS_VL_API_KEY_FILE / "
            "MOSS_VL_ADMIN_API_KEY_FILE (the chart mounts them from a Secret)",
        )
    # SGLang installs its API-key middleware only in single-tokenizer mode; with
    # more tokenizer workers the plugin installs it in each (hooks/patch_http_server),
    # which needs a line whose workers import moss_vl.http_app and the plugin loaded.
    if keyed and _http_workers(options) > 1:
        problem = _keyed_workers_problem(environ, sglang_version)
        if problem and preview and sglang_version is None:
            warnings.append(f"--tokenizer-worker-num with an API key: {problem}")
        elif problem:
            raise PresetError("--tokenizer-worker-num", problem)
    requested_device = _single_value(options, "--device")
    if requested_device is not None and requested_device != device:
        raise PresetError(
            "--device",
            f"SGLang --device {requested_device} contradicts the {device} preset; "
            f"choose the preset with `moss-vl serve --device {requested_device}`",
        )
    warning = check_model_path(_single_value(options, "--model-path"), preview)
    if warning:
        warnings.append(warning)

    prefill = _single_value(options, "--prefill-attention-backend")
    if device == "cuda":
        # SGLang 0.5.23 (attention_backends_of): an explicit
        # --prefill-attention-backend wins over --attention-backend, and the
        # preset always sets it, so only the prefill flag itself can move it.
        if prefill != "flashinfer":
            raise PresetError(
                "--prefill-attention-backend",
                f"{prefill!r} on cuda: MOSS-VL's cross-attention custom mask is applied "
                "only by the flashinfer prefill backend",
            )
    else:
        for flag in (
            "--attention-backend",
            "--prefill-attention-backend",
            "--decode-attention-backend",
        ):
            value = _single_value(options, flag)
            if value != "ascend":
                raise PresetError(
                    flag,
                    f"{value!r} on npu: the cross-attention mask path (AscendAttnBackend, "
                    "patched by the moss_vl plugin) needs the ascend backend",
                )
        for flag, why in RADIX_CACHE_FLAGS.items():
            if flag in options:
                raise PresetError(flag, f"forces the radix cache on ({why}); {NPU_RADIX_REASON}")
        for flag, why in NPU_UNMASKABLE_FLAGS.items():
            value = options[flag].values if flag in options else None
            if value is not None and not (flag == "--attn-cp-size" and value == ["1"]):
                raise PresetError(
                    flag,
                    f"{' '.join(value)} on npu: {why}, which cannot take MOSS-VL's "
                    "cross-attention mask; remove it",
                )
        for var in ("ASCEND_USE_FA", "ASCEND_USE_FIA"):
            raw = environ.get(var, "").strip().lower()
            if raw in ("1", "true", "yes", "on"):
                raise PresetError(
                    var,
                    f"{var}={environ[var]} selects fused attention operators that cannot take "
                    "the cross-attention mask; the npu preset needs it false",
                )

    tp = _int_value(options, "--tp-size", 1)
    if tp < 1:
        raise PresetError("--tp-size", f"{tp}: must be at least 1")
    pp = _int_value(options, "--pp-size", 1)
    dp = _int_value(options, "--dp-size", 1)
    nnodes = _int_value(options, "--nnodes", 1)
    # Knowable only on one node without data-parallel replicas (how DP maps to
    # devices depends on DP attention, which resolves later inside SGLang).
    if visible is not None and nnodes == 1 and dp == 1 and tp * pp != visible:
        wanted = f"tp {tp}" if pp == 1 else f"tp {tp} x pp {pp}"
        raise PresetError(
            "--tp",
            f"{wanted} needs {tp * pp} accelerators, but {visible} are visible ({visible_source}); "
            "set --tp to the visible count or change the visible devices",
        )
    return warnings


def _tokenizer_workers(
    device: str,
    cpus: int | None,
    extra: list[_Option],
    keyed: bool,
    environ: Mapping[str, str],
    sglang_version: str | None,
) -> tuple[int, list[str]]:
    """The preset's --tokenizer-worker-num (1: not emitted) and why it stayed 1."""
    workers = auto_tokenizer_workers(device, cpus)
    flags = {opt.flag for opt in extra}
    if workers == 1 or "--tokenizer-worker-num" in flags:
        return 1, []  # the operator's count, if any, is merged and checked as given
    single = sorted(flags & SINGLE_TOKENIZER_FLAGS.keys())
    if single:
        why = f"{single[0]}: {SINGLE_TOKENIZER_FLAGS[single[0]]}"
    elif keyed:
        # More workers only where the key is enforced in each; a count the operator
        # asks for is refused there instead (_check_merged).
        why = _keyed_workers_problem(environ, sglang_version)
    else:
        why = None
    if why:
        return 1, [f"--tokenizer-worker-num stays 1 (not {workers}): {why}"]
    return workers, []


def build_command(
    config: ServeConfig,
    visible: int | None = None,
    visible_source: str = "",
    environ: Mapping[str, str] | None = None,
    preview: bool = False,
    sglang_version: str | None | object = INSTALLED_SGLANG,
    cpus: int | None = None,
) -> ServeCommand:
    """The validated SGLang arguments and environment for `config`.

    `cpus`: the CPUs the server may use (None: unknown); the cuda preset runs
    `auto_tokenizer_workers` HTTP/tokenizer processes for them unless the extra
    arguments give `--tokenizer-worker-num`.

    `sglang_version`: the SGLang the server will run (default: the installed one;
    None: not installed), for checks that depend on its line.

    `visible` is the number of accelerators the server would see (None when
    unknowable); it is the tp default and the tp check's reference.
    `environ` is the environment the server inherits (default: os.environ).
    `preview` (a dry run): a local model path that does not exist here is a
    warning in the result, not a refusal.
    """
    env_in = os.environ if environ is None else environ
    _check_config(config)
    tp = config.tp if config.tp is not None else (visible or 1)
    extra = parse_extra_args(config.extra_args)
    secret_config = {
        name: value
        for name, value in (("api-key", config.api_key), ("admin-api-key", config.admin_api_key))
        if value
    }
    if secret_config and sglang_version is INSTALLED_SGLANG and (
        auto_tokenizer_workers(config.device, cpus) > 1
        or _http_workers({opt.flag: opt for opt in extra}) > 1
    ):
        # Which SGLang runs matters only to a keyed server with more than one
        # worker; looked up once, for both checks below.
        sglang_version = sglang_versions.installed()
    workers, warnings = _tokenizer_workers(
        config.device, cpus, extra, bool(secret_config), env_in, sglang_version)
    options = merge_options(_preset_options(config, tp, workers), extra)
    by_flag = {opt.flag: opt for opt in options}
    warnings += _check_merged(
        config.device, by_flag, visible, visible_source, env_in, preview,
        keyed=bool(secret_config), sglang_version=sglang_version,
    )

    argv: list[str] = []
    for opt in options:
        if opt.inline:
            argv.append(f"{opt.flag}={opt.values[0]}")
            argv.extend(opt.values[1:])
        else:
            argv.append(opt.flag)
            argv.extend(opt.values)

    env = dict(PRESETS[config.device].env)
    if _http_workers(by_flag) > 1 and not env_in.get(WORKER_HEALTHCHECK_ENV, "").strip():
        env[WORKER_HEALTHCHECK_ENV] = str(WORKER_HEALTHCHECK_TIMEOUT_S)
    # An operator may narrow SGLang's plugin whitelist (e.g. to leave moss_vl
    # out for an A/B run); an empty value would mean "load every plugin".
    if env_in.get("SGLANG_PLUGINS", "").strip():
        env["SGLANG_PLUGINS"] = env_in["SGLANG_PLUGINS"]
    return ServeCommand(
        device=config.device,
        argv=tuple(argv),
        env=env,
        model_path=_single_value(by_flag, "--model-path") or "",
        warnings=tuple(warnings),
        secret_config=secret_config,
    )


def read_key_file(path: str, variable: str) -> str:
    """The key in `path` (a Secret volume file); one trailing newline is dropped."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read()
    except OSError as err:
        raise PresetError(variable, f"cannot read the key file {path!r}: {err.strerror}") from None
    key = key[:-1] if key.endswith("\n") else key
    if not key or key != key.strip():
        raise PresetError(variable, f"the key file {path!r} is empty or has surrounding whitespace")
    return key


def secret_config_dir() -> str:
    """Where the --config file goes: a tmpfs when there is one (the pod's
    /dev/shm is a Memory emptyDir), so the keys never reach a disk."""
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def write_secret_config(command: ServeCommand, directory: str | None = None) -> str:
    """Write the keys as an SGLang --config file readable by this uid only; its path.

    JSON is YAML (SGLang reads it with yaml.safe_load), so no YAML writer is needed.
    The file stays: SGLang reads it after the exec, once, at start.
    """
    import json
    import tempfile

    fd, path = tempfile.mkstemp(
        prefix="moss-vl-serve-", suffix=".yaml", dir=directory or secret_config_dir()
    )
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(command.secret_config, f)
        f.write("\n")
    return path
