"""Tiny MOSS-VL checkpoints for tests: real layout, real special-token ids, random weights.

`write_tiny_checkpoint(path)` writes a directory that SGLang serves with
`--trust-remote-code` (and transformers loads with `trust_remote_code=True`);
`write_config_only(path)` writes the same minus the weights, for tests that only
resolve arguments. `python -m moss_vl.testing PATH` does the former from a shell.
"""

from moss_vl.testing.checkpoint import write_config_only, write_tiny_checkpoint

__all__ = ["write_config_only", "write_tiny_checkpoint"]
