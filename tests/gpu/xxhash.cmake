# tests/gpu/xxhash.cmake — xxhash for the tile code (kvq_tile.c) in the two standalone GPU
# projects, tests/gpu and tests/gpu/ingest (included by both after kernels/ made
# kvs_kernels; KVS_ROOT set). pkg-config's libxxhash when present (unless
# KVS_GPU_BUNDLED_XXHASH); otherwise xxhash.h compiled inline (XXH_INLINE_ALL: the header
# is a complete implementation) from KVS_XXHASH_DIR, by default <repo>/.gpu-deps
# (git-ignored), then /usr/include, /usr/local/include. Sets KVS_GPU_XXHASH to what was
# used ("pkg-config libxxhash <version>" or "inline <path>"), empty when none was found:
# the including project decides what that means.
set(KVS_XXHASH_DIR "${KVS_ROOT}/.gpu-deps" CACHE PATH "Directory with xxhash.h (inline build)")
option(KVS_GPU_BUNDLED_XXHASH "Ignore pkg-config's libxxhash, use xxhash.h inline" OFF)
set(KVS_GPU_XXHASH "")
if(NOT KVS_GPU_BUNDLED_XXHASH)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(KVS_XXH QUIET IMPORTED_TARGET libxxhash)
    if(KVS_XXH_FOUND)
      set(KVS_GPU_XXHASH "pkg-config libxxhash ${KVS_XXH_VERSION}")
      target_link_libraries(kvs_kernels PUBLIC PkgConfig::KVS_XXH)
    endif()
  endif()
endif()
if(NOT KVS_GPU_XXHASH)
  foreach(dir ${KVS_XXHASH_DIR} /usr/include /usr/local/include)
    if(EXISTS ${dir}/xxhash.h)
      set(KVS_GPU_XXHASH "inline ${dir}/xxhash.h")
      target_include_directories(kvs_kernels SYSTEM PRIVATE ${dir})
      target_compile_definitions(kvs_kernels PRIVATE XXH_INLINE_ALL)
      break()
    endif()
  endforeach()
endif()
