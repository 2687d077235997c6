"""The ground floor: what every analysis stands on, and nothing about spectra or importance.

* ``glossary``: the one vocabulary of parameters, with their defaults per budget; ``checks``: the one
  validator of scalar parameters; ``hardware``: what this machine runs fast;
* ``hub``: hub look-ups that fail fast offline; ``progress``: the work a run counts, in reference forwards;
* the cache, one module a job: ``cache`` (its folder and keys), ``tally`` (what a run read and computed),
  ``atomic`` (atomic files and folders, file hashes), ``tables`` (CSV and Parquet files), ``refresh``
  (``--refresh``), ``entries`` (verified entries, cached tables), ``manifest`` (checksummed folders),
  ``journal`` (resumable sweeps) and ``capture`` (entries carried to another machine's cache);
* ``adapters``: where each family keeps its blocks and matrices; ``models``: loading a model (and
  ``weights``: reading weight files without one); ``quantize``: weights round-tripped through a GGUF
  quantisation; ``data``: corpora and token windows;
* ``executors``: independent jobs, locally or on Ray.

Nothing here imports from another ``zones`` subpackage.
"""
