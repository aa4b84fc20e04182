"""What watches a run without steering it: sample grids and the reward monitor (``monitors``), the set that runs them
on schedule (``monitor_set``), the validation loss, FID (``fid_monitor``, over ``rewards.fid``), the trackers that
log them (``trackers``, ``tracker_media``) and the text encoder's cost report (``text_cost``)."""
