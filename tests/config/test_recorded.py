"""Paths of shipped models recorded by an install that has since moved (``config/recorded.py: relocated``): run
folders, checkpoints and caches record ``${asset:NAME}`` and ``${package_model:MODULE}`` resolved, and are read
with this install's copies once the recorded ones are gone; a path that still exists, or that no package holds, is
kept as recorded."""

from pathlib import Path

import yaml

from dit_trainer.config.recorded import relocated, relocated_paths
from dit_trainer.config.resolvers import ASSETS_DIR
from dit_trainer.run_config import saved_config

GONE = "/gone/checkout"  # an install that no longer exists


def test_a_shipped_asset_of_a_moved_checkout_is_this_installs():
    assert relocated(f"{GONE}/dit_trainer/assets/shapes_vae") == str(ASSETS_DIR / "shapes_vae")
    assert relocated(f"{GONE}/dit_trainer/assets/shapes_prompts.txt") == str(ASSETS_DIR / "shapes_prompts.txt")


def test_a_package_file_of_a_rebuilt_environment_is_this_environments():
    package = Path(yaml.__file__).parent  # any installed package with a file in it
    gone = f"/gone/venv/lib/python3.11/site-packages/{package.name}/{Path(yaml.__file__).name}"
    assert relocated(gone) == str(package / Path(yaml.__file__).name)


def test_paths_that_exist_or_that_no_install_holds_are_kept(tmp_path):
    other_install = tmp_path / "dit_trainer" / "assets" / "shapes_vae"  # another install's, still there: its own
    other_install.mkdir(parents=True)
    kept = [
        str(other_install),
        f"{GONE}/dit_trainer/assets/no_such_asset",  # this install ships no such file
        "/gone/data/images",  # no package folder in it
        "/gone/venv/lib/python3.11/site-packages/no_such_package_here/model",  # not installed here
        "/gone/not-site-packages/yaml/__init__.py",  # a folder named like a package, outside an install
        "PixArt-alpha/PixArt-XL-2-512x512",  # a hub id
        "a red circle",
    ]
    assert [relocated(value) for value in kept] == kept


def test_a_tree_is_relocated_leaf_by_leaf_and_says_what_moved():
    shipped = str(ASSETS_DIR / "shapes_vae")
    tree = {"vae": {"pretrained": f"{GONE}/dit_trainer/assets/shapes_vae"}, "prompts": ["/gone/x", 3], "n": None}
    relocated_tree, moved = relocated_paths(tree)
    assert relocated_tree == {"vae": {"pretrained": shipped}, "prompts": ["/gone/x", 3], "n": None}
    assert moved == {f"{GONE}/dit_trainer/assets/shapes_vae": shipped}


def test_a_run_folder_of_a_moved_checkout_reads_this_installs_models_with_a_warning(tmp_path, caplog):
    """It used to stop every resume, sample and export: "Could not load `vae.pretrained=...`: there is no folder"."""
    recorded = {"vae": {"pretrained": f"{GONE}/dit_trainer/assets/shapes_vae"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recorded))
    assert saved_config(tmp_path).vae.pretrained == str(ASSETS_DIR / "shapes_vae")
    assert f"{GONE}/dit_trainer/assets/shapes_vae -> {ASSETS_DIR / 'shapes_vae'}" in caplog.text
