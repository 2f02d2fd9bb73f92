"""Patch on ``...runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph`` (see the ledger).

Upstream refuses the decode graph for any encoder-decoder batch that holds a
request without encoder tokens (``torch.all(encoder_lens > 0)``), so one
text-only MOSS-VL request drags the whole batch to eager decode, and the check
itself reads a device tensor back every step.

For MOSS-VL that refusal is not needed. The captured forward always runs the
cross-attention layers (``get_is_capture_mode()``) and gates their output and
their MLP with ``full_text_row_masked_out_mask``, which in decode is
``encoder_lens != 0`` (computed on the device, inside the graph). A row with
encoder length 0 is planned with an empty KV range, so its cross-attention
output is finite and its contribution is multiplied by 0: exactly what the eager
path gives for the same row in a mixed batch. ``NPUGraphRunner`` subclasses
``DecodeCudaGraphRunner`` without overriding ``can_run_graph``, so the Ascend
graph runner takes the same decision.
"""

from __future__ import annotations

from moss_vl.hooks import Hook

TARGET = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph"
)
MOSS_VL_ARCH = "MossVLForConditionalGeneration"


def _serves_moss_vl(runner) -> bool:
    config = getattr(getattr(runner, "model_runner", None), "model_config", None)
    hf_config = getattr(config, "hf_config", None)
    return MOSS_VL_ARCH in (getattr(hf_config, "architectures", None) or ())


def admit_text_rows(original, self, forward_batch, *args, **kwargs):
    """Ask upstream everything but the encoder-length condition, for MOSS-VL only."""
    if not self.is_encoder_decoder or not _serves_moss_vl(self):
        return original(self, forward_batch, *args, **kwargs)
    # ``is_encoder_decoder`` gates nothing else in can_run_graph (and in
    # _can_run_ragged_verify_graph only the same condition): clearing it for
    # the call drops that one check and keeps every other upstream condition.
    self.is_encoder_decoder = False
    try:
        return original(self, forward_batch, *args, **kwargs)
    finally:
        self.is_encoder_decoder = True


TARGETS = [
    Hook(
        name="decode_cuda_graph_runner.admit_text_rows",
        target=TARGET,
        kind="around",
        func=admit_text_rows,
        signature=("self", "forward_batch"),
    ),
]
