"""The ground floor: what every analysis stands on, and nothing about spectra or importance.

* ``checks``: the one validator of scalar parameters; ``hardware``: what this machine runs fast;
* ``hub``: hub look-ups that fail fast offline; ``cache``: keys, checksummed entries, atomic writes;
* ``adapters``: where each family keeps its blocks and matrices; ``models``: loading a model (and
  ``weights``: reading weight files without one); ``data``: corpora and token windows;
* ``executors``: independent jobs, locally or on Ray.

Nothing here imports from another ``zones`` subpackage.
"""
