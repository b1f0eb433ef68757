"""Slurm: render a corral job as an sbatch script and submit it (``corral slurm``)."""
