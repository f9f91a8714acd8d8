"""gfx1250's architected SGPRs at wave launch, read the way the compiler reads them (the kernel
calls the builtins; expected values are what the builtins mean): the wave's index in its
workgroup (ttmp8[29:25]), workgroup and cluster ids (ttmp9, ttmp7), the workgroup's place in
its cluster and the cluster's extent (ttmp6, and HW_REG_IB_STS2 for the flat ones)."""
import torch

from mxgemm import toolchain
from mxgemm.emu import Emulator

FIELDS = ("wave_id", "cluster_id_x", "cluster_id_y", "cluster_id_z", "cluster_workgroup_id_x",
          "cluster_workgroup_id_y", "cluster_workgroup_id_z", "cluster_workgroup_flat_id",
          "cluster_workgroup_max_id_x", "cluster_workgroup_max_id_y", "cluster_workgroup_max_id_z",
          "cluster_workgroup_max_flat_id", "workgroup_id_x", "workgroup_id_y", "workgroup_id_z")

SOURCE = """
#include "mxgemm/device.h"
extern "C" __device__ unsigned wave_id() __asm("llvm.amdgcn.wave.id");
MXGEMM_KERNEL(ids)(unsigned* out) %ATTR% {
  const unsigned t = __builtin_amdgcn_workitem_id_x() + 96 * (__builtin_amdgcn_workgroup_id_x()
                     + 4 * __builtin_amdgcn_workgroup_id_y());
  unsigned* o = out + 16 * t;
  o[0] = wave_id();
""" + "".join(f"  o[{i}] = __builtin_amdgcn_{f}();\n" for i, f in enumerate(FIELDS) if i) + "}\n"


def _run(attr, grid, cluster):
    asm = toolchain.compile_hip_source(SOURCE.replace("%ATTR%", attr), "gfx1250")
    emu = Emulator(arch="gfx1250")
    out = torch.full((grid[0] * grid[1] * 96 * 16,), 0xDEAD, dtype=torch.int32)
    emu.launch(emu.load(asm), "ids", grid=grid, block=(96, 1, 1), args=[out])
    got = out.view(grid[1], grid[0], 96, 16)
    for y in range(grid[1]):
        for x in range(grid[0]):
            for t in range(96):
                cx, cy = cluster
                want = {"wave_id": t // 32, "workgroup_id_x": x, "workgroup_id_y": y, "workgroup_id_z": 0,
                        "cluster_id_x": x // cx, "cluster_id_y": y // cy, "cluster_id_z": 0,
                        "cluster_workgroup_id_x": x % cx, "cluster_workgroup_id_y": y % cy,
                        "cluster_workgroup_id_z": 0, "cluster_workgroup_flat_id": x % cx + cx * (y % cy),
                        "cluster_workgroup_max_id_x": cx - 1, "cluster_workgroup_max_id_y": cy - 1,
                        "cluster_workgroup_max_id_z": 0, "cluster_workgroup_max_flat_id": cx * cy - 1}
                row = dict(zip(FIELDS, got[y, x, t].tolist()))
                assert row == want, (x, y, t)


def test_ids_without_clusters():
    _run("", (4, 2, 1), (1, 1))


def test_ids_in_a_cluster_launch():
    _run("__attribute__((cluster_dims(2, 2, 1)))", (4, 2, 1), (2, 2))
