"""One build of each native op per user: paths spelt one way, a fixed per-user cache, a folder per compiler."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.job.build_cache import (
    cache_root,
    canonical_sys_path,
    cpu_isa,
    environment_id,
    extensions_dir_name,
    pin_build_environment,
)


def test_two_spellings_of_one_environment_become_one(tmp_path: Path) -> None:
    real = tmp_path / "main" / ".venv" / "lib"
    real.mkdir(parents=True)
    (tmp_path / "checkout").mkdir()
    (tmp_path / "checkout" / ".venv").symlink_to(tmp_path / "main" / ".venv")
    linked = tmp_path / "checkout" / ".venv" / "lib"
    assert str(linked) != str(real)
    assert canonical_sys_path([str(linked), "", str(tmp_path / "missing")]) == [
        os.path.realpath(real),
        "",
        str(tmp_path / "missing"),
    ]


def test_cache_root_is_per_user_and_can_be_moved(tmp_path: Path) -> None:
    assert cache_root({"GPUDAYS_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/gpudays")
    assert cache_root({}) == Path.home() / ".cache" / "gpudays"


def test_the_extensions_folder_names_python_torch_and_a_set_compiler() -> None:
    plain = extensions_dir_name({})
    assert plain.startswith(f"py{sys.version_info.major}{sys.version_info.minor}-torch")
    with_cxx = extensions_dir_name({"CXX": "/bin/false"})
    assert with_cxx.startswith(plain + "-cxx") and with_cxx != extensions_dir_name({"CXX": "/bin/true"})


def test_pinning_keeps_what_the_user_set(tmp_path: Path) -> None:
    env = {"GPUDAYS_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    settings = pin_build_environment(env)
    assert settings["TORCHINDUCTOR_CACHE_DIR"] == "/mine"
    assert settings["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions" / extensions_dir_name({}))
    assert env["TORCH_EXTENSIONS_DIR"] == settings["TORCH_EXTENSIONS_DIR"]
    again = pin_build_environment({"GPUDAYS_CACHE_DIR": str(tmp_path)})
    assert again["TORCH_EXTENSIONS_DIR"] == settings["TORCH_EXTENSIONS_DIR"], "the same folder every time"
    assert again["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def test_the_extensions_folder_names_the_cpus_instruction_set() -> None:
    skylake = "processor : 0\nflags : fpu sse sse2 avx avx2 fma avx512f avx512bw hypervisor constant_tsc\n"
    same_type = "processor : 0\nflags : fpu sse sse2 avx avx2 fma avx512f avx512bw arch_perfmon\n"
    zen2 = "processor : 0\nflags : fpu sse sse2 avx avx2 fma sha_ni\n"
    assert cpu_isa(skylake) == cpu_isa(same_type), "flags no build uses do not split a node type"
    assert cpu_isa(skylake) != cpu_isa(zen2), "an op built with AVX-512 is not run where there is none"
    assert extensions_dir_name({}, skylake) != extensions_dir_name({}, zen2)
    assert extensions_dir_name({}, skylake).endswith(cpu_isa(skylake))
    graviton = "processor : 0\nFeatures : fp asimd evtstrm aes sve sve2 bf16 i8mm\n"
    assert cpu_isa(graviton) != cpu_isa("processor : 0\nFeatures : fp asimd evtstrm aes\n")
    assert "-" not in cpu_isa(""), "no flags: the architecture alone"


def test_two_environments_build_in_two_folders_and_two_spellings_of_one_in_one(tmp_path: Path) -> None:
    main = [str(tmp_path / "python"), str(tmp_path / "main" / "torch"), str(tmp_path / "main" / "deepspeed")]
    other = [main[0], str(tmp_path / "ci" / "torch"), str(tmp_path / "ci" / "deepspeed")]
    (tmp_path / "main").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "main")
    linked = [main[0], str(tmp_path / "link" / "torch"), str(tmp_path / "link" / "deepspeed")]
    assert environment_id(main) != environment_id(other), "each environment's compile command names its own paths"
    assert environment_id(main) == environment_id(linked)
    assert extensions_dir_name({}, "", main) != extensions_dir_name({}, "", other)
    assert environment_id() in extensions_dir_name({}), "this environment's folder by default"
