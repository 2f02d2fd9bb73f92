"""moss-vl: serve MOSS-VL through SGLang on NVIDIA CUDA and Huawei Ascend."""

__version__ = "0.1.0"
