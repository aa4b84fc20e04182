"""scikit-learn's digits written as class folders (``data/sources/digits.py``, ``scripts/make_digits.py``): a folder
appears only when complete, so a failed attempt leaves nothing that blocks the next."""

import runpy
import sys

from tests.conftest import REPO


def test_without_scikit_learn_nothing_is_left_to_block_the_next_attempt(tmp_path, monkeypatch, capsys):
    main = runpy.run_path(str(REPO / "scripts" / "make_digits.py"))["main"]
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "sklearn.datasets", None)  # import fails as if scikit-learn were not installed
        assert main([str(tmp_path / "digits")]) == 2
    error = capsys.readouterr().err
    assert "scikit-learn, which is not installed" in error and "Traceback" not in error
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".digits.partial" / "3").mkdir(parents=True)  # what a killed attempt leaves
    (tmp_path / ".digits.partial" / "3" / "stray.png").write_bytes(b"")
    assert main([str(tmp_path / "digits"), "--resolution", "8"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits"]
    assert sorted(p.name for p in (tmp_path / "digits").iterdir()) == [str(label) for label in range(10)]
    assert sum(1 for _ in (tmp_path / "digits").rglob("*.png")) == 1797
