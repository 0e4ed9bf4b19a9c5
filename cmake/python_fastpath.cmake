# cmake/python_fastpath.cmake — fa4._fastpath (python/fa4/_fastpath.c): the Python package's C host
# path for eager torch calls. A CPython extension module with no torch headers and no link to
# libfa4 (it calls the entry points the package's ctypes binding hands it), built beside libfa4 so
# python/fa4/_capi.py finds it next to the library it loads: in the build tree at src/, in the
# wheel at fa4/lib/. Optional: without Python's headers the package keeps its ctypes path.
set(FA4_PYTHON_FASTPATH "AUTO" CACHE STRING
    "Build the Python package's C host path (fa4._fastpath): AUTO (if Python's headers are found), ON, OFF")
set_property(CACHE FA4_PYTHON_FASTPATH PROPERTY STRINGS AUTO ON OFF)
if(NOT FA4_PYTHON_FASTPATH STREQUAL "OFF")
  if(FA4_PYTHON_FASTPATH STREQUAL "ON")
    find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
  else()
    find_package(Python 3.9 QUIET COMPONENTS Interpreter Development.Module)
  endif()
  if(Python_Development.Module_FOUND)
    enable_language(C)
    Python_add_library(fa4_fastpath MODULE WITH_SOABI ${PROJECT_SOURCE_DIR}/python/fa4/_fastpath.c)
    target_include_directories(fa4_fastpath PRIVATE ${PROJECT_SOURCE_DIR}/include)
    set_target_properties(fa4_fastpath PROPERTIES OUTPUT_NAME _fastpath C_STANDARD 11 C_STANDARD_REQUIRED ON
                          C_VISIBILITY_PRESET hidden LIBRARY_OUTPUT_DIRECTORY $<TARGET_FILE_DIR:fa4>)
    target_compile_options(fa4_fastpath PRIVATE $<$<C_COMPILER_ID:GNU,Clang>:-Wall -Wextra>)
    # Built with the library: a build of target fa4 always has its host path beside it.
    add_dependencies(fa4 fa4_fastpath)
    if(SKBUILD)  # the wheel: beside fa4/lib/libfa4.so (a plain `cmake --install` leaves it out)
      install(TARGETS fa4_fastpath LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
    endif()
    message(STATUS "fa4: Python fast path ON (Python ${Python_VERSION}, ${Python_SOABI})")
  else()
    message(STATUS "fa4: Python fast path OFF (no Python interpreter with its headers found; the package uses ctypes only)")
  endif()
endif()
