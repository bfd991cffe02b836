# Sanitizers for every C target.
#   KVS_SANITIZE=ON      AddressSanitizer (with LeakSanitizer) and UBSan.
#   KVS_SANITIZE=thread  ThreadSanitizer (or KVS_TSAN=ON); cannot be combined with ASan.
# Findings abort (UBSan: no recovery), so ctest sees them as failures.
option(KVS_TSAN "Build with -fsanitize=thread (same as KVS_SANITIZE=thread)" OFF)
if(KVS_SANITIZE STREQUAL "thread")
  set(KVS_TSAN ON)
endif()
if(KVS_TSAN)
  set(KVS_SAN_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:${KVS_SAN_FLAGS}>")
  add_link_options(${KVS_SAN_FLAGS})
elseif(KVS_SANITIZE)
  set(KVS_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
      -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:${KVS_SAN_FLAGS}>")
  add_link_options(${KVS_SAN_FLAGS})
endif()
