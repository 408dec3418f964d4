# tinyteach — `make course` runs the course, `make test` checks everything.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
export PIP_NO_INPUT := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# the chapters' stored outputs show a CPU with 16 float lanes per vector (AVX-512); nbval runs
# the CPU device with that width on every machine, so the kernels it prints are the same
BOOK_VECTOR_WIDTH := 16

.PHONY: course course-deps demo student-copy chapter chapters nbval setup-test system-deps test lint \
        test-cpu-v3 fuzz gpu-check clean

# ---- course ---------------------------------------------------------------

# the course's JupyterLab settings (binder/overrides.json, Binder's too): no news popup, no update
# check. JupyterLab reads overrides.json from <sys.prefix>/share/jupyter/lab/settings
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json

# the course: JupyterLab on course/, on this machine only (127.0.0.1), opening on the tour; it
# prints the URL. course/ holds the chapters with the exercise's student copy in place of the
# solved notebook (which stays in chapters/, for nbval and instructors). A notebook already in
# course/ is kept, with the student's work (delete it to get the current one). The chapters are
# trusted first (`jupyter trust`: they are the course's own; a signature is of the content, so
# their copies are trusted too), so their stored outputs show as they were written
COURSE := course

course: $(VENV)/.installed-course $(LAB_SETTINGS) course-deps
	@mkdir -p $(COURSE)
	@test -e $(COURSE)/$(notdir $(EXERCISE)) || cp $(STUDENT_COPY) $(COURSE)/$(notdir $(EXERCISE))
	@test -e $(COURSE)/$(notdir $(PUZZLES)) || cp $(PUZZLES_COPY) $(COURSE)/$(notdir $(PUZZLES))
	@for notebook in $(filter-out $(EXERCISE) $(PUZZLES),$(wildcard chapters/*.ipynb)); do \
	  test -e $(COURSE)/$${notebook#chapters/} || cp $$notebook $(COURSE)/; done
	@$(VENV)/bin/jupyter trust chapters/*.ipynb >/dev/null
	@echo "==> starting JupyterLab on $(COURSE)/: open the .../lab/tree/00_tour.ipynb?token=... URL below"
	$(VENV)/bin/jupyter lab --notebook-dir=$(COURSE) --ServerApp.ip=127.0.0.1 --no-browser \
	  --LabApp.default_url=/lab/tree/00_tour.ipynb $(if $(filter 0,$(shell id -u)),--allow-root)

$(LAB_SETTINGS): binder/overrides.json | $(PY)
	@mkdir -p $(dir $@)
	cp binder/overrides.json $@

# graphviz draws the graphs in the notebooks (apt, only as root; the course runs without it)
course-deps:
	@if command -v dot >/dev/null 2>&1; then \
	  echo "==> graphviz found"; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "==> graphviz missing: install it (e.g. apt-get install graphviz) to see the graphs"; \
	else \
	  echo "==> installing graphviz with apt-get"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; } \
	  || echo "==> apt-get could not install graphviz: continuing without the graphs"; \
	fi

# the short demo: a fused kernel and its generated C source, in the terminal
demo:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-course
	$(PY) examples/demo.py

# the student copy of the exercise, generated from the chapter: each solution becomes
# `raise NotImplementedError()` and outputs are cleared. Run it after changing a solution
# (tests/test_exercises.py fails while the committed copy is out of date)
EXERCISE     := chapters/12_exercise_backend.ipynb
STUDENT_COPY := exercises/12_exercise_backend_student.ipynb
# chapter 8c's GPU puzzles have a student copy too (each kernel's body stubbed)
PUZZLES      := chapters/08c_gpu_puzzles.ipynb
PUZZLES_COPY := exercises/08c_gpu_puzzles_student.ipynb

student-copy:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-course
	$(PY) -m tinyteach.exercises.student_version $(EXERCISE) $(STUDENT_COPY)
	$(PY) -m tinyteach.exercises.student_version $(PUZZLES) $(PUZZLES_COPY)

# ---- the book: chapters/src/NN_name.py is the source of chapters/NN_name.ipynb ------------

# nbval's settings, shared by `make nbval` and `make test`. The chapters run in the book's own
# kernel, `tinyteach-book` (installed into the venv with the test extra): the venv's python with
# CPU_VECTOR_WIDTH=$(BOOK_VECTOR_WIDTH), so the unit tests of the same pytest run keep the CPU's
# own width. In `make test` each notebook runs whole on one xdist worker, in order, while the
# other worker takes unit tests (tests/conftest.py)
BOOK_KERNEL := tinyteach-book
NBVAL := --nbval --nbval-kernel-name $(BOOK_KERNEL) --nbval-sanitize-with chapters/nbval_sanitize.cfg
BOOK  := CPU_VECTOR_WIDTH=$(BOOK_VECTOR_WIDTH) $(PY) chapters/book.py

# one chapter, rebuilt from its source and executed, then trusted (as `make course` does):
# make chapter NB=08_codegen (KEEP_OUTPUTS=1: no run, the stored outputs of unchanged cell ids are
# kept; see chapters/src)
chapter:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-course
	@test -n "$(NB)" || { echo "usage: make chapter NB=08_codegen [KEEP_OUTPUTS=1]"; exit 2; }
	$(BOOK) build $(if $(KEEP_OUTPUTS),--keep-outputs) $(NB)
	@$(VENV)/bin/jupyter trust chapters/$(NB).ipynb >/dev/null

# every chapter, rebuilt from its source and executed
chapters:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-course
	$(BOOK) build --all
	@$(VENV)/bin/jupyter trust chapters/*.ipynb >/dev/null

# one chapter re-run by nbval and compared with its stored outputs: make nbval NB=08_codegen
nbval:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-test
	@test -n "$(NB)" || { echo "usage: make nbval NB=08_codegen"; exit 2; }
	$(VENV)/bin/pytest -p no:cacheprovider $(NBVAL) chapters/$(NB).ipynb

# ---- virtual environment (idempotent: stamps are redone only when pyproject.toml changes)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-course: pyproject.toml | $(PY)
	$(PIP) install -e '.[course]'
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install -e '.[test]'
	$(PY) -m ipykernel install --sys-prefix --name $(BOOK_KERNEL) \
	  --display-name "tinyteach book ($(BOOK_VECTOR_WIDTH) CPU lanes)" \
	  --env CPU_VECTOR_WIDTH $(BOOK_VECTOR_WIDTH) >/dev/null
	@touch $@

# ---- tests ----------------------------------------------------------------

# apt_install WHAT, CHECK, PACKAGES: install PACKAGES with apt-get unless CHECK succeeds; as
# root only, and never fatal (the tests that need WHAT skip, saying why)
define apt_install
	@if $(2); then \
	  echo "==> $(1) found"; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "==> $(1) missing and no apt-get as root: skipping (its tests skip, saying why)"; \
	else \
	  echo "==> installing $(1) with apt-get: $(3)"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(3) >/dev/null; } \
	  || echo "==> apt-get could not install $(3): continuing (their tests skip)"; \
	fi
endef

# clang (a second C compiler); graphviz and chromium (viz); Debian's pocl, an OpenCL on the CPU
# that builds for CPUs the pocl inside pyopencl's wheel (LLVM 14) does not know; lavapipe, a
# Vulkan on the CPU for WEBGPU
system-deps:
	$(call apt_install,clang,command -v clang >/dev/null 2>&1,clang)
	@command -v gcc >/dev/null 2>&1 || echo "==> warning: gcc not found; the CPU device needs a C compiler (set CC)"
	$(call apt_install,tcc (the CPU device's fast first tier),command -v tcc >/dev/null 2>&1,tcc)
	$(call apt_install,graphviz and chromium,command -v dot >/dev/null 2>&1 && \
	  command -v chromium >/dev/null 2>&1,graphviz chromium)
	$(call apt_install,Debian's pocl (OPENCL),ls /etc/OpenCL/vendors/pocl.icd >/dev/null 2>&1,\
	  pocl-opencl-icd ocl-icd-libopencl1)
	$(call apt_install,lavapipe (WEBGPU),ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1,\
	  mesa-vulkan-drivers libvulkan1)

setup-test: system-deps $(VENV)/.installed-test

# ruff reads the chapters' sources too (pyproject.toml allows their notebook idioms)
lint:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-test
	$(VENV)/bin/ruff check tinyteach viz tests examples chapters/book.py chapters/src

test: setup-test
	@echo "==> ruff"
	@$(MAKE) --no-print-directory lint
	@echo "==> mypy"
	$(VENV)/bin/mypy tinyteach
	@echo "==> pytest: the unit tests, and nbval: every chapter notebook, re-executed and compared with its stored outputs"
	@rc=0; $(VENV)/bin/pytest -n 2 --durations=10 $(NBVAL) chapters/*.ipynb tests || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "==> pytest collected no tests"; rc=0; fi; \
	v3=0; $(MAKE) --no-print-directory test-cpu-v3 || v3=$$?; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	exit $$v3

# the fuzzers at length (make test runs each one's fixed-seed slice): the slices with
# FUZZ_SCALE times their cases, then each fuzzer's own run over every available device
FUZZ_SCALE ?= 10
fuzz:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-test
	TINYTEACH_FUZZ_SCALE=$(FUZZ_SCALE) $(VENV)/bin/pytest -n 2 -p no:cacheprovider tests -k fuzz
	$(PY) tests/fuzz_graphs.py --graphs 1000
	$(PY) tests/fuzz_gpu_matmul.py --cases 200
	$(PY) tests/fuzz_gpu_options.py --cases 200

# ---- the CPU device's other target (issue 23) ------------------------------

# The CPU device builds its C for this machine (-march=native), and gcc decides differently for
# AVX-512 and AVX2 CPUs. On an AVX-512 machine, `test-cpu-v3` runs the CPU device's op suite and
# the chapters that show C kernels again, built for x86-64-v3 (AVX2) through the CPU_ARCH
# setting (tinyteach/runtime/cpu.py); the op suite at the target's own 8 lanes, the chapters at
# the book's 16. On an AVX2 machine the native run is that run, and it does nothing.
HAS_AVX512   := $(shell grep -q avx512f /proc/cpuinfo 2>/dev/null && echo 1)
CPU_V3       := x86-64-v3
# the test files whose tests take a `device`: every op, against PyTorch or numpy
CPU_OP_SUITE := tests/test_ops.py tests/test_creation.py tests/test_indexing.py \
                tests/test_dtypes.py tests/test_api_elementwise.py tests/test_special_values.py
# the chapters whose stored outputs show the CPU device's C (its kernels take `restrict data0`)
C_CHAPTERS    = $(shell grep -l 'restrict data0' chapters/*.ipynb)

test-cpu-v3:
	@test -x $(PY) || $(MAKE) --no-print-directory $(VENV)/.installed-test
ifeq ($(HAS_AVX512),1)
	@echo "==> the CPU device built for $(CPU_V3): $$(CPU_ARCH=$(CPU_V3) $(PY) -c \
	  'from tinyteach.runtime.cpu import describe_target; print(describe_target())')"
	@echo "==> the CPU device's op suite and the chapters with C kernels, built for $(CPU_V3): $(C_CHAPTERS)"
	CPU_ARCH=$(CPU_V3) TINYTEACH_REQUIRE_DEVICES=CPU $(VENV)/bin/pytest -n 2 -p no:cacheprovider \
	  $(NBVAL) $(C_CHAPTERS) $(CPU_OP_SUITE) -k "CPU or ipynb"
else
	@echo "==> no AVX-512 on this CPU: the native build was the only CPU target ($(CPU_V3) on AVX2)"
endif

# ---- on a machine with an NVIDIA GPU ---------------------------------------

# the one-shot GPU check (issue 14): op suite, TinyJit training and benchmarks against PyTorch on
# CUDA, at most 5 minutes; no network, no venv, no pip: the machine's own python3 and packages.
# Writes gpu_check_out/gpu_check.json and .md (GPU_CHECK_ARGS="--quick", "--device OPENCL", ...)
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py --out gpu_check_out $(GPU_CHECK_ARGS)

# ---- housekeeping ---------------------------------------------------------

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
