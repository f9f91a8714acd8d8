"""The assembly-snapshot tool sees a changed code object and only that one."""
from mxgemm import build
from mxgemm.tools import asm_snapshot


def test_compare_names_the_changed_code_object(tmp_path):
    kernels = ["mxfp8_dequant"]
    assert asm_snapshot.save(tmp_path, kernels, out=lambda *a, **k: None) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["mxfp8_dequant.gfx1250.base.s", "mxfp8_dequant.gfx950.base.s"]
    assert asm_snapshot.compare(tmp_path, kernels, out=lambda s: None) == []
    edited = tmp_path / "mxfp8_dequant.gfx950.base.s"
    edited.write_text(edited.read_text().replace("s_endpgm", "s_endpgm\n\ts_nop 0", 1))
    assert asm_snapshot.compare(tmp_path, kernels, out=lambda s: None) == ["mxfp8_dequant.gfx950.base.s"]
    assert build.artifact("mxfp8_dequant", {}, "gfx950").asm != edited.read_text()
