"""One of two gloo processes of ``test_image_sizes.py``'s two-process test, in a module of its own: a spawned process
imports the module of the function it runs, and this one needs torch, PIL and the sizes index alone, not the test
module's imports (the test suite's shared ones: some 15 s a process on 2 busy cores)."""

import json
from pathlib import Path

import torch.distributed
from PIL import Image

from dit_trainer.data.image_sizes import image_sizes
from dit_trainer.data.sources.imagefolder import ImageFolderDataset


def sizes_on_rank(rank: int, folder: str, rendezvous: str) -> None:
    """The image sizes of ``folder`` and how many headers this process read, in ``folder/../<rank>.json``."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    headers, pil_open = [], Image.open
    Image.open = lambda file, *args, **kwargs: headers.append(file) or pil_open(file, *args, **kwargs)  # a counter
    sizes = image_sizes(ImageFolderDataset(folder, 32), Path(folder).parent / "run" / "image_sizes")
    (Path(folder).parent / f"{rank}.json").write_text(json.dumps({"headers": len(headers), "sizes": sizes}))
    torch.distributed.destroy_process_group()
