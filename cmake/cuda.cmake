# KVS_CUDA=AUTO|ON|OFF. AUTO builds the CUDA kernels when check_language(CUDA) finds
# nvcc; ON without nvcc is a configure error; OFF never looks for nvcc.
# Sets KVS_CUDA_ENABLED and, when enabled, the CUDA language with C++17 host code.
set(KVS_CUDA_ENABLED OFF)
if(NOT KVS_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "KVS_CUDA must be AUTO, ON or OFF (got '${KVS_CUDA}')")
endif()
if(NOT KVS_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(KVS_NVCC nvcc HINTS /usr/local/cuda/bin)
    if(KVS_NVCC)
      set(CMAKE_CUDA_COMPILER "${KVS_NVCC}" CACHE FILEPATH "nvcc")
    endif()
  endif()
  # Default sm_90 (Hopper, the H100/H200 we target) unless the caller chose (cache or
  # CUDAARCHS): set before the language is enabled, else CMake picks its own default
  # (sm_52 with older CMake, sm_75 with CUDA 13: kernels built for the wrong chip, the
  # FP8 conversions in software). Override with -DCMAKE_CUDA_ARCHITECTURES.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures (kvstash default: 90)")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(KVS_CUDA_ENABLED ON)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  elseif(KVS_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVS_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
