"""Where images and captions come from: the ``Source`` contract and its builder (``source``), one module per source
(``shapes``, ``digits``, ``imagefolder``, ``hf``, ``webdataset`` with its ``shard_stream``), the streams' shared
helpers (``streams``) and the image transforms."""
