"""The command line: one clear error line, and the same tables as the library."""
import pandas as pd

from zones.cli import main


def test_unknown_model_is_one_clear_line(capsys, tmp_path):
    assert main(["alpha", "--model", str(tmp_path / "missing.gguf"), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zones alpha: error:") and "does not exist" in err
    assert not (tmp_path / "alpha.csv").exists()


def test_alpha_writes_the_library_table(tiny_model_dir, tmp_path):
    from zones.models import load_model
    from zones.spectra import alpha_table

    assert main(["alpha", "--model", str(tiny_model_dir), "--device", "cpu", "--out", str(tmp_path)]) == 0
    written = pd.read_csv(tmp_path / "alpha.csv")
    expected = alpha_table(load_model(str(tiny_model_dir), device="cpu").model)
    assert list(written["role"]) == list(expected["role"])
    assert written["alpha_shape"].round(6).equals(expected["alpha_shape"].round(6))


def test_book_rejects_unknown_chapters(capsys):
    assert main(["book", "--only", "no_such_chapter", "--no-execute"]) == 1
    assert "unknown chapter" in capsys.readouterr().err
