"""What a checkpoint holds and how a run resumes: ``checkpoint`` (save, restore, compatibility), its manifest and
errors, the run's counters and data position (``training_state``), the ``SavedState`` protocol of the parts that
save themselves, the changes a resume allows (``config_changes``) and the EMA."""
