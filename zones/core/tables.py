"""Tables as files: CSV or Parquet by the file's suffix, written atomically, read without threads."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from zones.core.atomic import atomic_write_bytes


def write_table(df: pd.DataFrame, path: Path) -> Path:
    """Write a table as CSV or Parquet (by suffix), atomically."""
    path = Path(path)
    atomic_write_bytes(path, table_bytes(df, path.suffix))
    return path


def table_bytes(df: pd.DataFrame, suffix: str) -> bytes:
    """A table as the bytes of a Parquet file (``suffix`` ``.parquet``), else of a CSV file."""
    buffer = io.BytesIO()
    if suffix == ".parquet":
        df.to_parquet(buffer, index=False)
    else:
        buffer.write(df.to_csv(index=False).encode("utf-8"))
    return buffer.getvalue()


def read_table(path: Path) -> pd.DataFrame:
    path = Path(path)
    return read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def read_parquet(source: Path | bytes) -> pd.DataFrame:
    """A Parquet table (a file or its bytes), read without starting a thread. A process in which
    Arrow has started its thread pools may abort as it exits ("terminate called without an
    active exception", SIGABRT; 9 of 300 short processes under load here, with pandas'
    ``read_parquet``), failing a kernel, a worker or a CLI run after its work was done. Even
    ``use_threads=False`` starts one; ``ParquetFile.read`` on an in-memory buffer starts none.
    The book's tables are small: one thread reads them as fast."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = Path(source).read_bytes() if isinstance(source, (str, Path)) else source
    table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    return table.to_pandas(use_threads=False)
