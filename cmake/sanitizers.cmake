# KVS_SANITIZE=ON: AddressSanitizer (with LeakSanitizer) and UBSan for every C target.
# UBSan findings abort so ctest sees them as failures.
if(KVS_SANITIZE)
  set(KVS_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
      -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:${KVS_SAN_FLAGS}>")
  add_link_options(${KVS_SAN_FLAGS})
endif()
