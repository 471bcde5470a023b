"""The files a run writes into its folder, named once: train(), resume=auto and the sweep table read them."""

RESULTS_FILE = "results.json"  # test accuracy, time, throughput: what the sweep table compares
RUN_CONFIG = "config.yaml"  # the resolved config, which resume=auto compares with the new run's
CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"  # written after every epoch and on preemption: the checkpoint a resumed run starts from
