"""The application's experiment configs: the schemas of the YAML files under ``configs/``.

``experiments.run_config`` is the run config of ``train_meta.py`` (task, sampler, training and
evaluation sections); the benchmark config of ``evaluate.py`` sits beside it. Like ``tasks/``,
this package is imported from a checkout and is not part of the installed library.
"""
