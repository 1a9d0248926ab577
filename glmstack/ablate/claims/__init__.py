"""One file per claim of `glmstack ablate`, each defining `CLAIM` (glmstack/ablate/claim.py). `glmstack ablate --list`."""
