"""TensorBoard scalars written directly, without TensorFlow or PyTorch.

An event file (``events.out.tfevents.*``) is a TFRecord file of ``tensorflow.Event``
protocol buffers. Each record is, little-endian: the data's length (uint64), the
masked CRC-32C of those 8 bytes (uint32), the data, the masked CRC-32C of the data
(uint32). Only the fields scalars need are encoded, by hand:

  Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
               Summary summary = 5; SessionLog session_log = 7; }
  Summary    { repeated Value value = 1; }
  Value      { string tag = 1; float simple_value = 2; }
  SessionLog { SessionStatus status = 1; }   // START = 1

A SessionLog START at step s tells TensorBoard that a run restarted there: it drops
the events it already read at steps >= s (how a resumed run hides the steps it logs
again). TensorBoard's Python loader takes a run's first START for its beginning and
purges only at later ones, so every file starts with one: at step 0 in a new run, at
the resumed step after a restart.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time

FILE_VERSION = "brain.Event:2"
_SESSION_START = 1
_FLOAT32_MAX = 3.4028234663852886e38


def _crc32c_table() -> tuple[int, ...]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected.
    table.append(crc)
  return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli) of `data`, as TFRecord files use it."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC: rotated right by 15 bits plus a constant."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, `data`, the data's masked CRC."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", masked_crc32c(length)) + data
          + struct.pack("<I", masked_crc32c(data)))


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    bits, value = value & 0x7F, value >> 7
    if value:
      out.append(bits | 0x80)
    else:
      out.append(bits)
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited field (wire type 2): a string or a nested message."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
  """`value` as a little-endian float32; beyond float32's range, ±inf (a diverged perplexity)."""
  if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
    value = math.copysign(math.inf, value)
  return struct.pack("<f", value)


def event(step: int, scalars: dict[str, float] | None = None, file_version: str | None = None,
          session_start: bool = False, wall_time: float | None = None) -> bytes:
  """A serialized Event at `step` holding one of: scalars (tag -> value), a file version, or
  a session start (they share a protobuf oneof, so a reader keeps only the last)."""
  if not 0 <= step < 2**63:
    raise ValueError(f"an event's step must be in [0, 2**63), not {step}")
  if sum((bool(scalars), file_version is not None, session_start)) > 1:
    raise ValueError("an event holds one of scalars, a file version or a session start")
  message = (_varint(1 << 3 | 1) + struct.pack("<d", time.time() if wall_time is None else wall_time)
             + _varint(2 << 3 | 0) + _varint(step))
  if file_version is not None:
    message += _field(3, file_version.encode())
  if scalars:
    values = b"".join(
        _field(1, _field(1, tag.encode()) + _varint(2 << 3 | 5) + _float32(value))
        for tag, value in scalars.items())
    message += _field(5, values)
  if session_start:
    message += _field(7, _varint(1 << 3 | 0) + _varint(_SESSION_START))
  return message


class EventFileWriter:
  """Appends scalar events to a new event file in `logdir`.

  The file starts with a session start: at `purge_step` when set, so TensorBoard hides
  what earlier files logged from there on, else at step 0.
  """

  def __init__(self, logdir: str, purge_step: int | None = None, filename_suffix: str = ""):
    os.makedirs(logdir, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}{filename_suffix}"
    self.path = os.path.join(logdir, name)
    self._file = open(self.path, "ab")
    self._file.write(tfrecord(event(0, file_version=FILE_VERSION)))
    self._file.write(tfrecord(event(0 if purge_step is None else purge_step, session_start=True)))
    self.flush()

  def add_scalars(self, scalars: dict[str, float], step: int) -> None:
    """One event holding every (tag, value) of `scalars` at `step`."""
    self._file.write(tfrecord(event(step, scalars=scalars)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()
