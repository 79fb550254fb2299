"""A private one-node Slurm cluster and the node-job scenario run on it."""
