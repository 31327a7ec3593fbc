// Package trace parses request traces in the Mooncake FAST'25 format, one
// JSON object per line:
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
//
// timestamp is the arrival in milliseconds from the trace start (an integer
// or a float), input_length the prompt in tokens, output_length the decode
// length (optional, 0 when absent), hash_ids one id per BlockTokens block of
// the prompt: equal ids at equal positions are equal tokens. It is the one
// parser of `orbitkv sim` (bench/sim) and `orbitkv bench serving --workload
// trace`, so a trace one accepts the other accepts.
//
// Invariants of a parsed trace:
//
//  1. Unknown fields are ignored (traces carry extra columns); blank lines
//     are skipped; every other line is a record or the whole parse fails
//     with ErrTrace and the line number.
//  2. timestamp, input_length and hash_ids are present; timestamp is finite,
//     at least 0 and below MaxTimestampMs; input_length is positive;
//     output_length and every hash id are not negative.
//  3. Records come back in arrival order, stable for equal timestamps; Index
//     is the record's position in the file (blank lines not counted).
//  4. hash_ids are not checked against input_length: tokens past the last id
//     are the request's own, extra ids are unused.
package trace
