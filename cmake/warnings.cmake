# Warning flags for every C target. -Werror is on by default (CI builds with it);
# pass -DKVS_WERROR=OFF to experiment locally.
set(KVS_C_WARNINGS -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
    -Wformat=2 -Wvla -Wno-unused-parameter)
if(KVS_WERROR)
  list(APPEND KVS_C_WARNINGS -Werror)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:C>:${KVS_C_WARNINGS}>")
