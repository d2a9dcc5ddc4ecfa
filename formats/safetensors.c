/* safetensors.c - the one translation unit that compiles the implementation in safetensors.h. */
#define SAFETENSORS_IMPLEMENTATION
#include "safetensors.h"
