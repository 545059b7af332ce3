"""Find C functions in a live process: ``/proc/PID/maps`` plus the ELF dynamic symbol table.

gdb could look the symbols up itself, but loading libpython's symbols takes it
~0.3 s while the patient is stopped. Resolving addresses here, before gdb
attaches, lets gdb run with no symbols at all (``set sysroot`` to nowhere) and
keeps the stop to a few tens of milliseconds. Every address is checked against
the process's own memory before it is used: calling a wrong address would
crash the patient.

The ELF file is the patient's (a ``libpython3.99.so`` of its own, mapped into its process) and is
read by root: its headers are claims, not facts. Each read is checked against the file's real size
and a fixed budget (:data:`HEADERS_MAX_BYTES`, :data:`TABLE_MAX_BYTES`), only the first ``.dynsym``
is read (ELF has one), and a file that does not fit is refused with a :class:`SymbolError`: a
sparse 8 kB file claiming a 2 GiB ``.dynsym`` once made a 2 s attach take 65 s and 2.1 GB (issue
#34). One image costs at most 2 x 1 MiB of headers and 2 x 8 MiB of tables.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_PT_LOAD = 1
_SHT_DYNSYM = 11
_STT_FUNC = 2
_STT_OBJECT = 1
_CHECK_BYTES = 16
_EHDR_BYTES, _PHDR_BYTES, _SHDR_BYTES, _SYM_BYTES = 64, 56, 64, 24  # ELF64 record sizes

# Budgets of one image. Real ones are far below: libc.so.6 has 14 program and 64 section headers,
# a 73 kB .dynsym and a 33 kB .dynstr; libpython3.11.so 9, 38, 48 kB and 37 kB.
HEADERS_MAX_BYTES = 1 << 20  # program or section headers: 16,384 sections
TABLE_MAX_BYTES = 8 << 20  # .dynsym or its string table: ~350,000 symbols, 100x libc's


class SymbolError(Exception):
    """A symbol could not be resolved safely; the message says why."""


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    inode: int
    path: str


@dataclass(frozen=True)
class ElfSymbol:
    value: int
    kind: int  # STT_FUNC / STT_OBJECT


@dataclass(frozen=True)
class _Load:
    vaddr: int
    offset: int
    filesz: int


def read_maps(pid: int) -> list[Mapping]:
    """File-backed mappings of ``pid`` (PermissionError / FileNotFoundError propagate)."""
    out = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(Mapping(lo, hi, int(parts[2], 16), int(parts[4]), parts[5].rstrip("\n")))
    return out


class _Claims:
    """Reads of an ELF file whose headers say where and how much: each within the file and the budgets."""

    def __init__(self, fh: IO[bytes], path: str) -> None:
        self.fh = fh
        self.path = path
        self.size = os.fstat(fh.fileno()).st_size

    def read(self, offset: int, size: int, what: str, cap: int) -> bytes:
        if size > cap:
            raise SymbolError(f"{self.path}: its {what} claims {size} bytes, over the "
                              f"{cap} the doctor reads (refused)")
        if offset + size > self.size:
            raise SymbolError(f"{self.path}: its {what} ({size} bytes at {offset}) lies past the "
                              f"end of the file ({self.size} bytes) (refused)")
        self.fh.seek(offset)
        data = self.fh.read(size)
        if len(data) != size:
            raise SymbolError(f"{self.path}: shorter than its {what} claims (changed while read?)")
        return data


def _elf_tables(data_path: str, inode: int, name: str = "") -> tuple[list[_Load], dict[str, ElfSymbol]]:
    """PT_LOAD segments and defined dynamic symbols of a 64-bit little-endian ELF file (``name``:
    its path as the process mapped it, for messages)."""
    name = name or data_path
    with _open_image(data_path, inode) as fh:
        claims = _Claims(fh, name)
        head = claims.read(0, _EHDR_BYTES, "ELF header", _EHDR_BYTES)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise SymbolError(f"{name}: not a 64-bit little-endian ELF file")
        (phoff, shoff) = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        if (phnum and phentsize < _PHDR_BYTES) or (shnum and shentsize < _SHDR_BYTES):
            raise SymbolError(f"{name}: its headers are shorter than ELF64's (refused)")
        phdrs = claims.read(phoff, phentsize * phnum, "program headers", HEADERS_MAX_BYTES)
        loads = []
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", phdrs, i * phentsize)
            if p_type == _PT_LOAD:
                loads.append(_Load(p_vaddr, p_offset, p_filesz))
        shdrs = claims.read(shoff, shentsize * shnum, "section headers", HEADERS_MAX_BYTES)
        sections = [struct.unpack_from("<IIQQQQII", shdrs, i * shentsize) for i in range(shnum)]
        dynsym = next((s for s in sections if s[1] == _SHT_DYNSYM and s[6] < len(sections)), None)
        if dynsym is None:  # ELF has at most one .dynsym: the first is the one
            return loads, {}
        table = claims.read(dynsym[4], dynsym[5], ".dynsym", TABLE_MAX_BYTES)
        strings = sections[dynsym[6]]
        strtab = claims.read(strings[4], strings[5], ".dynstr", TABLE_MAX_BYTES)
    return loads, _defined(table, strtab)


def _defined(table: bytes, strtab: bytes) -> dict[str, ElfSymbol]:
    """The functions and objects a ``.dynsym`` defines, by name (the first of a name wins)."""
    symbols: dict[str, ElfSymbol] = {}
    for pos in range(0, len(table) - _SYM_BYTES + 1, _SYM_BYTES):
        st_name, st_info, _, st_shndx, st_value = struct.unpack_from("<IBBHQ", table, pos)
        kind = st_info & 0xF
        if st_shndx == 0 or kind not in (_STT_FUNC, _STT_OBJECT) or not st_value:
            continue
        end = strtab.find(b"\0", st_name)
        symbols.setdefault(strtab[st_name:end].decode("ascii", "replace"), ElfSymbol(st_value, kind))
    return symbols


class ElfImage:
    """One ELF file as mapped into a process: its load bias and dynamic symbols."""

    def __init__(self, pid: int, maps: list[Mapping]) -> None:
        self.pid = pid
        self.path = maps[0].path
        self.inode = maps[0].inode
        self.data_path = _same_file(pid, maps)
        self.loads, self.symbols = _elf_tables(self.data_path, self.inode, self.path)
        first = min(maps, key=lambda m: m.offset)
        if first.offset != 0 or not self.loads:
            raise SymbolError(f"{self.path}: its ELF header is not mapped")
        self.bias = first.start - (min(ld.vaddr for ld in self.loads) & ~0xFFF)

    def address(self, name: str) -> int | None:
        sym = self.symbols.get(name)
        if sym is None:
            return None
        addr = self.bias + sym.value
        self._check(name, sym.value, addr)
        return addr

    def _check(self, name: str, vaddr: int, addr: int) -> None:
        """The first bytes at ``addr`` in the process must equal the file's bytes there."""
        seg = next((ld for ld in self.loads if ld.vaddr <= vaddr < ld.vaddr + ld.filesz), None)
        if seg is None:
            raise SymbolError(f"{name} in {self.path} is not in a loaded segment")
        with _open_image(self.data_path, self.inode) as fh:
            fh.seek(seg.offset + vaddr - seg.vaddr)
            want = fh.read(_CHECK_BYTES)
        if read_memory(self.pid, addr, len(want)) != want:
            raise SymbolError(f"{name} in {self.path}: the process's code differs from the file on disk "
                              "(library replaced while the process runs?)")


def _same_file(pid: int, maps: list[Mapping]) -> str:
    """A path that opens the very file the process mapped (checked by inode)."""
    m = maps[0]
    clean = m.path.removesuffix(" (deleted)")
    for cand in (f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}", f"/proc/{pid}/root{clean}", clean):
        try:
            _open_image(cand, m.inode).close()
            return cand
        except (OSError, SymbolError):
            continue
    raise SymbolError(f"cannot open {m.path} as the process sees it")


def _open_image(path: str, inode: int) -> IO[bytes]:
    """``path`` opened for reading only if it is the regular file with ``inode``.

    The paths may be in folders the patient's user can change: a FIFO swapped in after a
    check must not block the doctor (O_NONBLOCK), and only the file checked is read (fstat).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_ino != inode:
        os.close(fd)
        raise SymbolError(f"{path} is not the file the process mapped")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_memory(pid: int, addr: int, size: int) -> bytes:
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as fh:
        fh.seek(addr)
        return fh.read(size)


def images(pid: int, pattern: str) -> list[ElfImage]:
    """Mapped ELF files of ``pid`` whose base name matches ``pattern`` (a regex)."""
    by_path: dict[str, list[Mapping]] = {}
    for m in read_maps(pid):
        by_path.setdefault(m.path, []).append(m)
    rx = re.compile(pattern)
    return [ElfImage(pid, ms) for path, ms in by_path.items() if rx.search(Path(path).name)]


def python_image(pid: int) -> ElfImage | None:
    """The image holding the CPython C API: libpython if loaded, else the executable."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = None
    cands = images(pid, r"^libpython\d") + (images(pid, "^" + re.escape(exe) + "$") if exe else [])
    return next((img for img in cands if "Py_AddPendingCall" in img.symbols), None)


def libc_image(pid: int) -> ElfImage:
    found = images(pid, r"^(libc\.so|libc-|ld-musl)")
    img = next((i for i in found if "mmap" in i.symbols), None)
    if img is None:
        raise SymbolError("no C library with mmap is mapped")
    return img


def python_version(pid: int, image: ElfImage) -> tuple[int, int] | None:
    """(major, minor) from ``Py_Version`` (3.11+); None for older or unknown builds."""
    addr = image.address("Py_Version")
    if addr is None:
        return None
    hexversion = struct.unpack("<I", read_memory(pid, addr, 4))[0]
    return hexversion >> 24, (hexversion >> 16) & 0xFF
