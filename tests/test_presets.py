"""moss_vl.presets: the DESIGN.md §4 table and the validated SGLang command.

Contract: every flag a preset emits exists in SGLang 0.5.23's real argument
parser and parses to the values the preset means (flashinfer prefill on CUDA;
ascend backends, no radix cache and decode graphs on NPU); extra arguments
override preset values in place instead of repeating them; contradictions are
refused with a PresetError naming the flag and the reason; secrets never
appear in the displayed command.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from moss_vl import presets
from moss_vl.presets import PresetError, ServeConfig, build_command

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


@pytest.fixture()
def model_dir(tmp_path) -> str:
    path = tmp_path / "MOSS-VL-Instruct"
    path.mkdir()
    return str(path)


def parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    return parser.parse_args(list(argv))


def options_in(argv) -> list[str]:
    return [tok.partition("=")[0] for tok in argv if tok.startswith("--")]


def test_sglang_is_the_generation_the_presets_target():
    from importlib.metadata import version

    assert version("sglang") == presets.SGLANG_VERSION


@pytest.mark.parametrize("dev", presets.DEVICES)
def test_every_emitted_flag_exists_in_sglang(sglang_parser, model_dir, dev):
    command = build_command(ServeConfig(device=dev, model_path=model_dir), visible=2)
    known = sglang_parser._option_string_actions
    for flag in options_in(command.argv):
        assert flag in known, f"{flag} is not an SGLang {presets.SGLANG_VERSION} flag"


def test_every_flag_the_module_names_exists_in_sglang(sglang_parser):
    known = sglang_parser._option_string_actions
    names = set(presets.GUARDED_FLAGS) | set(presets.RADIX_CACHE_FLAGS) | set(presets.SECRET_FLAGS)
    names |= {alias for alias, target in presets.ALIASES.items() if alias != "--tp"}
    names |= set(presets.ALIASES.values())
    missing = sorted(n for n in names if n not in known)
    assert not missing, f"not SGLang {presets.SGLANG_VERSION} flags: {missing}"
    # `--tp` is argparse's unique-prefix expansion of --tp-size
    assert parse(sglang_parser, ["--model-path", "m", "--tp", "3"]).tp_size == 3


def test_refusing_abbreviations_never_refuses_a_real_flag(sglang_parser):
    """An exact SGLang flag that is a prefix of a guarded one would be refused."""
    real = set(sglang_parser._option_string_actions)
    clashes = sorted(
        flag
        for flag in real
        if flag.startswith("--")
        and flag not in presets.GUARDED_FLAGS
        and flag not in presets.ALIASES
        and any(g.startswith(flag) and g != flag for g in presets.GUARDED_FLAGS)
    )
    assert clashes == []


def test_cuda_preset_parses_to_flashinfer_prefill(sglang_parser, model_dir):
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    command = build_command(
        ServeConfig(device="cuda", model_path=model_dir, served_model_name="moss-vl"), visible=4
    )
    args = parse(sglang_parser, command.argv)
    assert args.prefill_attention_backend == "flashinfer"
    assert attention_backends_of(args)[0] == "flashinfer"
    assert args.device is None
    assert (args.trust_remote_code, args.enable_multimodal, args.enable_metrics) == (True,) * 3
    assert args.dtype == "bfloat16"
    assert args.tp_size == 4  # tp defaults to the visible accelerators
    assert (args.host, args.port) == ("0.0.0.0", presets.DEFAULT_PORT)
    assert args.model_path == model_dir and args.served_model_name == "moss-vl"
    assert args.disable_radix_cache is False
    assert command.env == {"SGLANG_PLUGINS": "moss_vl",
                           "SGLANG_HTTP_SERVER_APP_PATH": "moss_vl.http_app:app"}


def test_npu_preset_parses_to_ascend_without_radix_cache(sglang_parser, model_dir):
    command = build_command(ServeConfig(device="npu", model_path=model_dir), visible=8)
    args = parse(sglang_parser, command.argv)
    assert args.device == "npu"
    assert args.attention_backend == "ascend"
    assert args.prefill_attention_backend == "ascend"
    assert args.decode_attention_backend == "ascend"
    assert args.sampling_backend == "ascend"
    assert args.mm_attention_backend == "ascend_attn"
    assert args.disable_radix_cache is True
    assert args.cuda_graph_bs_decode == list(presets.NPU_CUDA_GRAPH_BS)
    assert args.tp_size == 8
    assert (args.trust_remote_code, args.enable_multimodal, args.enable_metrics) == (True,) * 3
    assert command.env == {
        "SGLANG_PLUGINS": "moss_vl",
        "SGLANG_HTTP_SERVER_APP_PATH": "moss_vl.http_app:app",
        "ASCEND_USE_FA": "false",
        "ASCEND_USE_FIA": "false",
    }


def test_plugin_name_is_the_entry_point_name():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry_points = pyproject["project"]["entry-points"]["sglang.srt.plugins"]
    assert presets.PLUGIN_NAME in entry_points
    for preset in presets.PRESETS.values():
        assert preset.env["SGLANG_PLUGINS"] == presets.PLUGIN_NAME


HEALTHCHECK = presets.WORKER_HEALTHCHECK_ENV


@pytest.mark.parametrize(
    "device, cpus, extra, expected",
    [
        ("cuda", 16, (), "120"),  # the preset's 8 workers
        ("cuda", None, ("--tokenizer-worker-num", "4"), "120"),  # the operator's 4
        ("cuda", 2, (), None),  # one worker: no uvicorn supervisor
        ("cuda", 16, ("--tokenizer-worker-num", "1"), None),
        ("npu", 16, (), None),
    ],
)
def test_http_workers_get_a_health_check_longer_than_their_bootstrap(
    model_dir, device, cpus, extra, expected
):
    command = build_command(ServeConfig(device=device, model_path=model_dir, extra_args=extra),
                            visible=1, cpus=cpus, environ={})
    assert command.env.get(HEALTHCHECK) == expected
    if expected:
        assert int(expected) == presets.WORKER_HEALTHCHECK_TIMEOUT_S > 30  # the H200's bootstrap


def test_an_operators_worker_health_check_stands(model_dir):
    config = ServeConfig(device="cuda", model_path=model_dir)
    # Left out of the preset's env, so the server inherits the operator's value.
    assert HEALTHCHECK not in build_command(config, cpus=16, environ={HEALTHCHECK: "30"}).env
    assert build_command(config, cpus=16, environ={HEALTHCHECK: " "}).env[HEALTHCHECK] == "120"


def test_operator_plugin_whitelist_is_kept(model_dir):
    config = ServeConfig(device="cuda", model_path=model_dir)
    assert build_command(config, environ={"SGLANG_PLUGINS": "none"}).env["SGLANG_PLUGINS"] == "none"
    # empty means "every plugin" to SGLang: the preset's whitelist applies
    assert build_command(config, environ={"SGLANG_PLUGINS": ""}).env["SGLANG_PLUGINS"] == "moss_vl"


def test_typed_settings_become_flags(sglang_parser, model_dir):
    config = ServeConfig(
        device="cuda",
        model_path=model_dir,
        port=31000,
        host="127.0.0.1",
        tp=2,
        mem_fraction_static=0.8,
        context_length=32768,
        max_running_requests=16,
        cuda_graph_bs=(1, 2, 4),
    )
    args = parse(sglang_parser, build_command(config, visible=2).argv)
    assert (args.port, args.host, args.tp_size) == (31000, "127.0.0.1", 2)
    assert args.mem_fraction_static == 0.8
    assert args.context_length == 32768
    assert args.max_running_requests == 16
    assert args.cuda_graph_bs_decode == [1, 2, 4]


def test_extra_args_override_in_place(sglang_parser, model_dir):
    config = ServeConfig(
        device="npu",
        model_path=model_dir,
        extra_args=(
            "--tp",
            "2",
            "--cuda-graph-bs-decode",
            "1",
            "2",
            "--mem-fraction-static=0.75",
            "--max-running-requests",
            "8",
            "--max-running-requests",
            "32",
        ),
    )
    command = build_command(config, visible=2)
    flags = options_in(command.argv)
    assert len(flags) == len(set(flags)), f"a flag repeats: {flags}"
    assert "--tp" not in flags  # spelled the canonical way
    assert flags.index("--tp-size") < flags.index("--trust-remote-code")  # replaced in place
    assert "--mem-fraction-static=0.75" in command.argv
    args = parse(sglang_parser, command.argv)
    assert args.tp_size == 2
    assert args.cuda_graph_bs_decode == [1, 2]
    assert args.mem_fraction_static == 0.75
    assert args.max_running_requests == 32  # the last one wins, as in argparse


def test_cuda_attention_backend_does_not_move_prefill(sglang_parser, model_dir):
    """SGLang 0.5.23: an explicit prefill backend wins over --attention-backend."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    config = ServeConfig(
        device="cuda", model_path=model_dir, extra_args=("--attention-backend", "fa3")
    )
    args = parse(sglang_parser, build_command(config, visible=1).argv)
    assert attention_backends_of(args) == ("flashinfer", "fa3")


def refused(config: ServeConfig, **kwargs) -> PresetError:
    with pytest.raises(PresetError) as info:
        build_command(config, **kwargs)
    return info.value


@pytest.mark.parametrize("backend", ["fa3", "triton", "torch_native"])
def test_cuda_refuses_another_prefill_backend(model_dir, backend):
    err = refused(
        ServeConfig(
            device="cuda", model_path=model_dir, extra_args=("--prefill-attention-backend", backend)
        ),
        visible=1,
    )
    assert err.flag == "--prefill-attention-backend"
    assert backend in err.reason and "flashinfer" in err.reason


def test_abbreviated_guarded_flag_is_refused(model_dir):
    err = refused(
        ServeConfig(
            device="cuda", model_path=model_dir, extra_args=("--prefill-attention-b", "triton")
        ),
        visible=1,
    )
    assert err.flag == "--prefill-attention-b"
    assert "--prefill-attention-backend" in err.reason


@pytest.mark.parametrize(
    "extra",
    [
        ("--enable-hierarchical-cache",),
        ("--enable-hicache",),
        ("--enable-session-radix-cache",),
        ("--radix-cache-backend", "mine"),
        ("--disaggregation-decode-enable-radix-cache",),
        ("--enable-unified-cache-external-linker",),
    ],
)
def test_npu_refuses_radix_cache_forced_on(sglang_parser, model_dir, extra):
    # each is a real flag SGLang would accept ...
    parse(sglang_parser, ["--model-path", "m", *extra])
    # ... and the npu preset refuses it by its canonical name
    err = refused(ServeConfig(device="npu", model_path=model_dir, extra_args=extra), visible=1)
    assert err.flag == presets.ALIASES.get(extra[0], extra[0])
    assert "radix cache" in err.reason and "--disable-radix-cache" in err.reason


@pytest.mark.parametrize(
    "flag", ["--attention-backend", "--prefill-attention-backend", "--decode-attention-backend"]
)
def test_npu_refuses_non_ascend_attention(model_dir, flag):
    err = refused(
        ServeConfig(device="npu", model_path=model_dir, extra_args=(flag, "torch_native")),
        visible=1,
    )
    assert err.flag == flag and "ascend" in err.reason


@pytest.mark.parametrize("var", ["ASCEND_USE_FA", "ASCEND_USE_FIA"])
def test_npu_refuses_fused_attention_env(model_dir, var):
    err = refused(ServeConfig(device="npu", model_path=model_dir), visible=1, environ={var: "1"})
    assert err.flag == var and "mask" in err.reason
    # the preset's own value is accepted
    build_command(
        ServeConfig(device="npu", model_path=model_dir), visible=1, environ={var: "false"}
    )


@pytest.mark.parametrize(
    "extra",
    [
        ("--speculative-algorithm", "NGRAM"),
        ("--attn-cp-size", "2"),
        ("--attention-context-parallel-size", "2"),
        ("--dllm-algorithm", "LowConfidence"),
    ],
)
def test_npu_refuses_flags_that_take_the_mask_off_the_native_path(sglang_parser, model_dir, extra):
    parse(sglang_parser, ["--model-path", "m", *extra])  # real SGLang flags
    err = refused(ServeConfig(device="npu", model_path=model_dir, extra_args=extra), visible=1)
    assert err.flag == presets.ALIASES.get(extra[0], extra[0])
    assert "cross-attention mask" in err.reason and "remove it" in err.reason
    # cuda applies the mask in FlashInfer whatever these say
    build_command(ServeConfig(device="cuda", model_path=model_dir, extra_args=extra), visible=1)


def test_npu_accepts_attn_cp_size_1(model_dir):
    build_command(
        ServeConfig(device="npu", model_path=model_dir, extra_args=("--attn-cp-size", "1")),
        visible=1,
    )


def test_sglang_device_flag_must_match_the_preset(model_dir):
    err = refused(
        ServeConfig(device="cuda", model_path=model_dir, extra_args=("--device", "npu")), visible=1
    )
    assert err.flag == "--device" and "moss-vl serve --device npu" in err.reason


def test_config_file_is_refused(model_dir):
    err = refused(
        ServeConfig(device="cuda", model_path=model_dir, extra_args=("--config", "x.yaml")),
        visible=1,
    )
    assert err.flag == "--config"


def test_extra_args_must_start_with_a_flag(model_dir):
    err = refused(ServeConfig(device="cuda", model_path=model_dir, extra_args=("32",)), visible=1)
    assert err.flag == "32"


@pytest.mark.parametrize("path", ["OpenMOSS/MOSS-VL-Instruct-0708", "org/name.v2"])
def test_hub_ids_are_accepted(path):
    build_command(ServeConfig(device="cuda", model_path=path), visible=1)


@pytest.mark.parametrize(
    "path", ["/nonexistent/MOSS-VL", "./missing", "a/b/c", "../x", "noslash", ""]
)
def test_missing_local_paths_are_refused(path):
    err = refused(ServeConfig(device="cuda", model_path=path), visible=1)
    assert err.flag == "--model-path"


def test_model_path_from_extra_args_is_checked_too(model_dir):
    err = refused(
        ServeConfig(device="cuda", model_path=model_dir, extra_args=("--model", "/nonexistent/m")),
        visible=1,
    )
    assert err.flag == "--model-path" and "/nonexistent/m" in err.reason


def test_tp_must_match_visible_accelerators(model_dir):
    err = refused(
        ServeConfig(device="cuda", model_path=model_dir, tp=4),
        visible=2,
        visible_source="CUDA_VISIBLE_DEVICES=0,1",
    )
    assert err.flag == "--tp"
    assert "4" in err.reason and "2 are visible" in err.reason
    assert "CUDA_VISIBLE_DEVICES=0,1" in err.reason
    # the same through the extra arguments
    err = refused(
        ServeConfig(device="cuda", model_path=model_dir, extra_args=("--tp-size", "8")), visible=2
    )
    assert err.flag == "--tp"


def test_tp_check_only_when_knowable(model_dir):
    build_command(ServeConfig(device="cuda", model_path=model_dir, tp=3), visible=None)
    # tp x pp devices on one node
    build_command(
        ServeConfig(device="cuda", model_path=model_dir, tp=2, extra_args=("--pp-size", "2")),
        visible=4,
    )
    # data parallel and multi-node layouts are decided inside SGLang
    build_command(
        ServeConfig(device="cuda", model_path=model_dir, tp=2, extra_args=("--dp-size", "2")),
        visible=8,
    )
    build_command(
        ServeConfig(device="cuda", model_path=model_dir, tp=16, extra_args=("--nnodes", "2")),
        visible=8,
    )


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("port", 0, "--port"),
        ("port", 70000, "--port"),
        ("tp", 0, "--tp"),
        ("mem_fraction_static", 1.5, "--mem-fraction-static"),
        ("context_length", 0, "--context-length"),
        ("max_running_requests", -1, "--max-running-requests"),
        ("cuda_graph_bs", (0, 2), "--cuda-graph-bs"),
        ("device", "tpu", "--device"),
        ("host", "", "--host"),
    ],
)
def test_bad_settings_name_their_flag(model_dir, field, value, flag):
    settings = {"device": "cuda", "model_path": model_dir, field: value}
    assert refused(ServeConfig(**settings), visible=None).flag == flag


def test_secrets_are_masked_for_display():
    shown = " ".join(presets.mask_secrets(["--api-key", "s3cr3t", "--admin-api-key=adm1n"]))
    assert "s3cr3t" not in shown and "adm1n" not in shown
    assert f"--api-key {presets.MASK}" in shown and f"--admin-api-key={presets.MASK}" in shown


# ---- tokenizer workers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "device, cpus, workers",
    [("cuda", 16, 8), ("cuda", 128, 8), ("cuda", 8, 4), ("cuda", 3, 1), ("cuda", None, 1),
     ("npu", 16, 1)],
)
def test_auto_tokenizer_workers(device, cpus, workers):
    assert presets.auto_tokenizer_workers(device, cpus) == workers


def test_the_cuda_preset_runs_a_tokenizer_worker_per_two_cpus(sglang_parser, model_dir):
    argv = build_command(ServeConfig(device="cuda", model_path=model_dir), visible=1, cpus=16).argv
    assert parse(sglang_parser, argv).tokenizer_worker_num == 8
    # Unknown CPUs, too few of them, or the npu preset: SGLang's one process (no flag).
    for device, cpus in (("cuda", None), ("cuda", 3), ("npu", 16)):
        argv = build_command(ServeConfig(device=device, model_path=model_dir), visible=1,
                             cpus=cpus).argv
        assert "--tokenizer-worker-num" not in argv
        assert parse(sglang_parser, argv).tokenizer_worker_num == 1


def test_the_operators_tokenizer_worker_count_wins(sglang_parser, model_dir):
    for asked in ("1", "3"):
        argv = build_command(
            ServeConfig(device="cuda", model_path=model_dir,
                        extra_args=("--tokenizer-worker-num", asked)),
            visible=1, cpus=16,
        ).argv
        assert argv.count("--tokenizer-worker-num") == 1
        assert parse(sglang_parser, argv).tokenizer_worker_num == int(asked)


@pytest.mark.parametrize(
    "version, environ, workers",
    [("0.5.23", {"SGLANG_PLUGINS": "moss_vl"}, 8), ("0.5.17", {}, 1), (None, {}, 1),
     ("0.5.23", {"SGLANG_PLUGINS": "none"}, 1)],
)
def test_a_keyed_server_gets_workers_only_where_each_enforces_the_key(
    sglang_parser, model_dir, version, environ, workers
):
    command = build_command(
        ServeConfig(device="cuda", model_path=model_dir, api_key="k"),
        visible=1, cpus=16, environ=environ, sglang_version=version,
    )
    assert parse(sglang_parser, command.argv).tokenizer_worker_num == workers
    if workers == 1:
        assert any("--tokenizer-worker-num stays 1 (not 8)" in w for w in command.warnings)
    else:
        assert not command.warnings


def test_usable_cpus_follow_the_cgroup_quota(tmp_path):
    import os

    from moss_vl.device import usable_cpus

    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(str(tmp_path)) == affinity  # no cpu.max: no quota
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(tmp_path)) == affinity
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: 2 may run at once
    assert usable_cpus(str(tmp_path)) == min(affinity, 2)
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert usable_cpus(str(tmp_path)) == 1


@pytest.mark.parametrize("flag, values", [("--grpc-port", ["50051"]), ("--encoder-only", []),
                                          ("--max-ep-size", ["16"])])
def test_serving_modes_with_one_tokenizer_process_keep_one(sglang_parser, model_dir, flag, values):
    assert flag in sglang_parser._option_string_actions
    command = build_command(ServeConfig(device="cuda", model_path=model_dir,
                                        extra_args=(flag, *values)), visible=1, cpus=16)
    assert "--tokenizer-worker-num" not in command.argv
    assert any(flag in w and "stays 1" in w for w in command.warnings), command.warnings
