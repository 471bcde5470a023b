"""Training: the Lightning module, optimizer, callbacks, exact resume and preemption, config checks, and train(cfg).

Nothing is imported here, so that a light module (run_folder.py) does not bring Lightning with it."""
