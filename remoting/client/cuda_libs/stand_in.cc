// stand_in.cc — the whole of each stand-in CUDA library (libcudart, libcublas, libcublasLt): no code.
// A job under posd finds these first (LD_LIBRARY_PATH) and libpos_client serves its calls (docs/remoting.md).
//
// Why they exist: a program linked against the toolkit's libraries loads them even when every call
// it makes goes to libpos_client. libcublasLt alone fills ~90 MB of private pages at load, which CRIU
// reads, compares and restores at every stop of a migration or dump. Each stand-in only has the
// name (SONAME) and the one symbol version (the same name) that the program's references ask of
// the real library; the symbols themselves come from libpos_client, preloaded before it.
