"""Packaging: the distribution name and version, the cache setting, library logging."""

import logging
import os
import subprocess
import sys
import tomllib
from importlib import metadata

import constrained_decoding as cd
from constrained_decoding import _cache
from constrained_decoding import _version
from constrained_decoding import cli
from constrained_decoding import models
from constrained_decoding.automata import _detokenizer

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_distribution_name_and_version():
  with open(os.path.join(_ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)
  assert project["project"]["name"] == _version.DISTRIBUTION != "constrained-decoding"
  assert project["project"]["dynamic"] == ["version"]
  assert project["tool"]["setuptools"]["dynamic"]["version"] == {
      "attr": "constrained_decoding._version.__version__"}
  # Installed (make test installs it): the metadata, written from the same constant.
  assert cd.__version__ == metadata.version(_version.DISTRIBUTION) == _version.__version__


def test_version_without_installed_metadata():
  code = ("from importlib import metadata\n"
          "def missing(name): raise metadata.PackageNotFoundError(name)\n"
          "metadata.version = missing\n"
          "import constrained_decoding as cd, constrained_decoding._version as v\n"
          "print(cd.__version__ == v.__version__)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "True"


def test_one_cache_setting(monkeypatch, tmp_path):
  monkeypatch.setenv("CONSTRAINED_DECODING_CACHE", str(tmp_path / "c"))
  assert cd.CompileOptions().cache_dir == str(tmp_path / "c")
  assert models.default_cache_dir() == str(tmp_path / "c" / "models")
  monkeypatch.delenv("CONSTRAINED_DECODING_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cd.CompileOptions().cache_dir == str(tmp_path / "xdg" / "constrained_decoding")
  monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert _cache.cache_root() == str(tmp_path / "home" / ".cache" / "constrained_decoding")
  monkeypatch.setenv("CONSTRAINED_DECODING_CACHE", "~/elsewhere")
  assert models.default_cache_dir() == str(tmp_path / "home" / "elsewhere" / "models")
  # An explicit cache_dir still wins.
  assert cd.CompileOptions(cache_dir=None).cache_dir is None


def test_compiler_writes_under_the_setting_and_logs(monkeypatch, tmp_path, caplog, capsys):
  monkeypatch.setenv("CONSTRAINED_DECODING_CACHE", str(tmp_path))
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [b"ab", None],
                                         eos_ids=[257])
  with caplog.at_level(logging.INFO, logger="constrained_decoding"):
    cd.Compiler(vocab).compile(cd.Regex("a+b"))
  assert os.listdir(tmp_path) == [f"trie-v{_detokenizer.TRIE_FORMAT_VERSION}-"
                                  f"{vocab.fingerprint}{_detokenizer.ARRAYS_SUFFIX}"]
  messages = [r.getMessage() for r in caplog.records if r.name.startswith("constrained_")]
  assert any(m.startswith("building the token trie for Vocabulary(") for m in messages)
  assert capsys.readouterr().err == ""  # logging, not print


def test_cli_shows_library_messages_as_before(monkeypatch, tmp_path, capsys):
  monkeypatch.setenv("CONSTRAINED_DECODING_CACHE", str(tmp_path / "cache"))
  code = cli.main(["compile", "--regex", "[0-9]+", "-o", str(tmp_path / "t.cdt")])
  err = capsys.readouterr().err
  assert code == 0, err
  assert "constrained_decoding: building the token trie for Vocabulary(" in err
  assert "constrained_decoding: trie with " in err
  assert any(name.startswith("trie-v") for name in os.listdir(tmp_path / "cache"))
  # The command leaves the library's logger as it found it (no handler left behind to
  # print later library messages of the same process).
  assert not logging.getLogger("constrained_decoding").handlers
