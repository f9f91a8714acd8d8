# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2025 FlyDSL Project Contributors

"""Reusable FlyDSL Python examples and kernel builders.

This directory is a Python package so tests can import kernel builders via:
`from kernels.norm.layernorm_kernel import build_layernorm_module`.
"""
