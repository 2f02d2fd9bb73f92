"""The decode graph admits MOSS-VL batches with text-only rows, and nothing else changes.

Driven through upstream's real ``DecodeCudaGraphRunner.can_run_graph`` on a
runner carrying just the attributes that method reads: upstream refuses a batch
with an ``encoder_lens == 0`` row; through the hook the same batch runs, while
every other upstream condition (batch size over the captured maximum, embeds
overrides, other models) still refuses as before.
"""

from __future__ import annotations

import types

import pytest
import torch

runner_mod = pytest.importorskip("sglang.srt.model_executor.runner.decode_cuda_graph_runner")

from moss_vl.hooks.patch_decode_cuda_graph_runner import TARGETS, admit_text_rows  # noqa: E402

UPSTREAM = runner_mod.DecodeCudaGraphRunner.can_run_graph


def _runner(architecture="MossVLForConditionalGeneration", max_bs=8):
    runner = object.__new__(runner_mod.DecodeCudaGraphRunner)
    runner.__dict__.update(
        ragged_verify_mode=False,
        require_mlp_tp_gather=False,
        enable_pdmux=False,
        record_nolora_graph=False,
        disable_padding=False,
        max_bs=max_bs,
        require_mlp_sync=False,
        enable_two_batch_overlap=False,
        is_encoder_decoder=True,
        attention_graph_variants=None,
        model_runner=types.SimpleNamespace(
            spec_algorithm=types.SimpleNamespace(is_ngram=lambda: False),
            model_config=types.SimpleNamespace(
                hf_config=types.SimpleNamespace(architectures=[architecture])
            ),
        ),
    )
    return runner


def _batch(encoder_lens, replace_embeds=None):
    return types.SimpleNamespace(
        replace_embeds=replace_embeds,
        spec_info=None,
        batch_size=len(encoder_lens),
        encoder_lens=torch.tensor(encoder_lens),
        lora_ids=None,
        forward_mode=None,
    )


@pytest.mark.parametrize("encoder_lens", [[0, 257, 514], [0, 0, 0]], ids=["mixed", "text-only"])
def test_upstream_refuses_and_the_hook_admits_text_rows(encoder_lens):
    runner, batch = _runner(), _batch(encoder_lens)
    assert not bool(UPSTREAM(runner, batch))
    assert admit_text_rows(UPSTREAM, runner, batch) is True
    assert runner.is_encoder_decoder is True  # restored after the call


def test_every_other_condition_still_refuses():
    assert not admit_text_rows(UPSTREAM, _runner(max_bs=2), _batch([0, 257, 514]))
    embeds = _batch([0, 257], replace_embeds=torch.zeros(1))
    assert not admit_text_rows(UPSTREAM, _runner(), embeds)


def test_other_encoder_decoder_models_keep_upstreams_check():
    runner, batch = _runner(architecture="MllamaForConditionalGeneration"), _batch([0, 257])
    assert not bool(admit_text_rows(UPSTREAM, runner, batch))


def test_restores_the_flag_when_upstream_raises():
    runner = _runner()

    def broken(self, forward_batch):
        raise RuntimeError("upstream failed")

    with pytest.raises(RuntimeError):
        admit_text_rows(broken, runner, _batch([0, 1]))
    assert runner.is_encoder_decoder is True


def test_declared_target_is_the_method_exercised_here():
    (hook,) = TARGETS
    assert hook.target.endswith("DecodeCudaGraphRunner.can_run_graph")
    assert hook.kind == "around"
