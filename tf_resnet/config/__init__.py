"""A run's configuration, free of TensorFlow: what is asked, and if it fits.

`schema` says how a setting is declared; `settings` holds the groups
(with `datasets` and `families`, where the data and model groups stand
beside the facts they choose from) and `Config`; `presets` the named
layers of settings; `layers` a run's config from its layers and the
`config.json` it keeps; `validation` whether the settings fit together;
`flags` the command line generated from the settings; `engines` the
registry of distribution engines, every fact of each.

Nothing here imports TensorFlow (a test checks): launchers, tools and the
checks of a run's settings load it in a fraction of a second.
"""
