// Package benchutil holds what several of the benchmarks under bench/
// share: scratch directories that go on any exit, the memory-file-system
// check, fio as the SSD baseline, and the small statistics the tables print.
// Nothing here measures; each bench package owns its own figures.
package benchutil
