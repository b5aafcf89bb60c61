package pgdedup

// The names of the previous release, kept for one more release so that
// programs keep compiling. CHANGELOG.md lists them with their replacements.

// Partition is the former name of [TopicPartition].
//
// Deprecated: use [TopicPartition].
type Partition = TopicPartition

// ContentKey is the former name of [MessageIDFromContent].
//
// Deprecated: use [MessageIDFromContent].
func ContentKey(payload []byte) string { return MessageIDFromContent(payload) }

// Plain and Partitioned are the former names of [LayoutPlain] and
// [LayoutPartitioned].
const (
	// Deprecated: use [LayoutPlain].
	Plain = LayoutPlain
	// Deprecated: use [LayoutPartitioned].
	Partitioned = LayoutPartitioned
)
