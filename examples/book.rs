//! Code the book includes (`{{#include}}` with anchors), compiled and tested here.
