// mpi-plugin-host: loads an MPI program built as a shared object (mpi_plugin.c) the way Python
// loads mpi4py's MPI module: dlopen with RTLD_LOCAL, so that neither the program nor the MPI
// library it links is in the process's global scope. Not linked with any MPI itself.
//
//   mpi-plugin-host PLUGIN.so [ARGS...]      runs the plugin's plugin_main(ARGS...)
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpi-plugin-host PLUGIN.so [ARGS...]\n");
    return 2;
  }
  void* plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (plugin == nullptr) {
    std::fprintf(stderr, "mpi-plugin-host: %s\n", dlerror());
    return 2;
  }
  using Main = int (*)(int, char**);
  auto run = reinterpret_cast<Main>(dlsym(plugin, "plugin_main"));
  if (run == nullptr) {
    std::fprintf(stderr, "mpi-plugin-host: %s has no plugin_main\n", argv[1]);
    return 2;
  }
  return run(argc - 1, argv + 1);
}
