# ipcref: the single header is generated from src/ and committed.
#   make            regenerate ipcref.h if src/ changed, then check it
#   make test       the whole suite (tests/run.sh)
#   make soak       the crash tests with 1000 kill rounds (IPCREF_SOAK_ROUNDS)
#   make demo       build and run the examples
#   make bench      our workloads beside the peers', as ratios
#   make format     clang-format the sources (format-check: only look)
#   make install    headers and ipcref.pc under $(DESTDIR)$(PREFIX)
#   make python     the Python package, importable from build/python
#   make gpu-test   tests/test_gpu.c's device flows on the real drivers
#                   (libcuda.so.1, libamdhip64) instead of the fakes; on a
#                   machine without a GPU it says so and exits 0

PREFIX   ?= /usr/local
DESTDIR  ?=
PYTHON   ?= python3
# The interpreter the Python package is built for: Debian's, which has
# numpy and torch (another python3 may come first on PATH).
PY       ?= $(firstword $(wildcard /usr/bin/python3) python3)
CC       ?= cc
BUILD_DIR ?= ./build
CFLAGS   ?= -O2 -Wall -Wextra -Wpedantic -Werror
# Where cuda.h is: $(CUDA_HOME)/include if it has one, else /usr/local/cuda's
# (as tests/fake_gpu/build.sh looks). Only the cuda_share example needs it.
CUDA_INC ?= $(or $(if $(CUDA_HOME),$(patsubst %/cuda.h,%,$(wildcard $(CUDA_HOME)/include/cuda.h))),/usr/local/cuda/include)

LAYERS  := $(wildcard src/*.h) src/manual.txt src/licence.txt
# The generated headers are checked too: tools/amalgamate.py puts the
# backend headers through clang-format 14 (renaming src/gpu.h changes line
# lengths).
GENERATED := ipcref.h $(wildcard ipcref_cuda.h ipcref_hip.h)
FORMATTED := $(wildcard src/*.h tests/*.c tests/*.h tests/*/*.c tests/*/*.h \
                        examples/*.c bench/*.c bench/*.h bench/peers/*.c \
                        bench/peers/*.cpp bench/peers/iceoryx/*.c \
                        python/ipcref/*.c) $(GENERATED)
EXAMPLES := threads_demo share_demo object_store

.PHONY: all check test soak demo bench format format-check install uninstall clean python gpu-test

all: ipcref.h check

ipcref.h: $(LAYERS) tools/amalgamate.py
	$(PYTHON) tools/amalgamate.py

check:
	@$(PYTHON) tools/amalgamate.py --check

test: all
	@bash tests/run.sh

soak: ipcref.h
	@mkdir -p $(BUILD_DIR)
	$(CC) -O2 -g -std=c11 -Wall -Wextra -Wpedantic -Werror -I. \
	  tests/test_crash.c -o $(BUILD_DIR)/test_crash -pthread
	IPCREF_SOAK_ROUNDS=$${IPCREF_SOAK_ROUNDS:-1000} $(BUILD_DIR)/test_crash

demo: ipcref.h
	@mkdir -p $(BUILD_DIR)
	@for e in $(EXAMPLES); do \
	  $(CC) $(CFLAGS) -std=c11 -I. examples/$$e.c -o $(BUILD_DIR)/$$e -pthread && \
	  $(BUILD_DIR)/$$e || exit 1; \
	done
	@# Programs started on their own, meeting at a socket path (in the
	@# abstract namespace: no file is left): a producer, a consumer that
	@# keeps 4 frames, and a greedy one that would keep 12 (capped at 8).
	@$(CC) $(CFLAGS) -std=c11 -I. examples/frames_producer.c -o $(BUILD_DIR)/frames_producer -pthread && \
	  $(CC) $(CFLAGS) -std=c11 -I. examples/frames_consumer.c -o $(BUILD_DIR)/frames_consumer -pthread && \
	  sock=@ipcref-frames-$$$$ && \
	  { $(BUILD_DIR)/frames_producer $$sock 200 --stats & pid=$$!; \
	    $(BUILD_DIR)/frames_consumer $$sock 12 & greedy=$$!; \
	    $(BUILD_DIR)/frames_consumer $$sock; c=$$?; wait $$greedy; g=$$?; \
	    wait $$pid; p=$$?; [ $$c = 0 ] && [ $$g = 0 ] && [ $$p = 0 ]; } || exit 1
	@# The device example needs CUDA's header; without a GPU it says why.
	@if [ -f $(CUDA_INC)/cuda.h ]; then \
	  $(CC) $(CFLAGS) -std=c11 -I. -I$(CUDA_INC) examples/cuda_share.c \
	    -o $(BUILD_DIR)/cuda_share -pthread -ldl && $(BUILD_DIR)/cuda_share; \
	else echo "cuda_share: not built (no cuda.h in $(CUDA_INC): set CUDA_HOME or CUDA_INC)"; fi

# The Python package (python/ipcref) built in place: PYTHONPATH=build/python.
PY_EXT = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PY_INC = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
python: ipcref.h
	@test -f "$(PY_INC)/Python.h" || { echo "make python: no Python.h for $(PY) (apt-get install python3-dev)"; exit 1; }
	@mkdir -p $(BUILD_DIR)/python/ipcref
	$(CC) -O2 -g -std=c11 -Wall -Wextra -Werror -fPIC -shared -I$(PY_INC) -I. \
	  python/ipcref/_ipcref.c -o $(BUILD_DIR)/python/ipcref/_ipcref$(PY_EXT) -pthread
	@cp python/ipcref/*.py $(BUILD_DIR)/python/ipcref/

bench: ipcref.h
	@bash bench/run.sh

# The flows that need none of the fakes' knobs: legacy IPC, VMM memory
# and pool memory (where device 0 shares them by fd), wrapping,
# forwarding, a consumer killed, a lying peer. Built as make test builds test_gpu, with cuda.h's
# prototypes checked where it is found.
gpu-test: ipcref.h
	@mkdir -p $(BUILD_DIR)
	$(CC) -O2 -g -std=c11 -Wall -Wextra -Wpedantic -Werror -I. -I$(CUDA_INC) \
	  tests/test_gpu.c -o $(BUILD_DIR)/gpu_test -pthread -ldl
	IPCREF_GPU_REAL=1 $(BUILD_DIR)/gpu_test

# The style is clang-format 14's (Debian 12's): another major version
# formats differently, so both targets ask for 14.
CLANG_FORMAT ?= clang-format
CF_CHECK = v=$$($(CLANG_FORMAT) --version 2>/dev/null | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
  if [ "$$v" != 14 ]; then \
    echo "make $@: needs clang-format 14 (found: $${v:-none}; apt-get install clang-format)"; exit 1; fi

format:
	@$(CF_CHECK)
	$(CLANG_FORMAT) -i $(filter-out $(GENERATED),$(FORMATTED))
	$(PYTHON) tools/amalgamate.py

format-check:
	@$(CF_CHECK)
	@$(CLANG_FORMAT) --dry-run --Werror $(FORMATTED)

install: ipcref.h
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(GENERATED) $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e "s|@VERSION@|$$(sed -n 's/^#define IPCREF_VERSION_STRING "\(.*\)"/\1/p' ipcref.h)|" \
	  tools/ipcref.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ipcref.pc

uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/include/,$(GENERATED)) \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig/ipcref.pc

clean:
	rm -rf $(BUILD_DIR)
