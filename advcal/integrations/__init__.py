"""advcal inside RL trainers: ``advcal.integrations.trl`` and ``advcal.integrations.verl``.

Each module imports its framework only when it is used, so importing this package costs
nothing and needs no trainer installed.
"""
