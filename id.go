package pgdedup

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxMessageIDLen is the longest message ID accepted, in bytes.
const MaxMessageIDLen = 1024

// ValidateMessageID returns nil if id can be recorded, or an error wrapping
// [ErrInvalidMessageID] that says why not. An ID is 1 to [MaxMessageIDLen]
// bytes of UTF-8 without NUL, and not blank. An ID of only whitespace
// (unicode.IsSpace) is refused, as a blank Consumer is, since it is almost
// always a missing value. Other IDs are kept byte for byte, spaces around
// them included. Every call that takes an ID calls it before any round trip.
// It is exported for consumers that want to reject a message early.
func ValidateMessageID(id string) error {
	if err := idProblem(id); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidMessageID, err)
	}
	return nil
}

// idProblem says what is wrong with id, or returns nil.
func idProblem(id string) error {
	if len(id) > MaxMessageIDLen {
		return fmt.Errorf("%d bytes, longer than %d", len(id), MaxMessageIDLen)
	}
	if err := validateText(id); err != nil {
		return err
	}
	if strings.TrimFunc(id, unicode.IsSpace) == "" {
		return errors.New("blank (only whitespace)")
	}
	return nil
}

// validateText rejects what Postgres text cannot hold or what can never be a
// meaningful key.
func validateText(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}

// sortedBatch is a batch of IDs ready to claim, valid and each once. The IDs
// are sorted by key, the order of the primary key. They are inserted in that
// order so that overlapping batches lock rows in the same order and cannot
// deadlock. keys[i] is the key of ids[i].
type sortedBatch struct {
	ids, keys []string
}

// prepareBatch validates every ID and returns them sorted by key and without
// repeats. One bad ID rejects the whole batch, and so do more than max IDs.
func prepareBatch(consumer string, ids []string, max int) (sortedBatch, error) {
	if len(ids) > max {
		return sortedBatch{}, fmt.Errorf("%w: %d IDs, more than Config.MaxBatch (%d): split it", ErrBatchTooLarge, len(ids), max)
	}
	for i, id := range ids {
		if err := idProblem(id); err != nil {
			return sortedBatch{}, fmt.Errorf("%w: message %d of %d: %s", ErrInvalidMessageID, i, len(ids), err)
		}
	}
	type entry struct{ key, id string }
	entries := make([]entry, len(ids))
	for i, id := range ids {
		entries[i] = entry{Key(consumer, id), id}
	}
	// The text form of a UUID sorts as its bytes do, as Postgres orders uuid.
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	entries = slices.CompactFunc(entries, func(a, b entry) bool { return a.key == b.key })
	b := sortedBatch{ids: make([]string, len(entries)), keys: make([]string, len(entries))}
	for i, e := range entries {
		b.ids[i], b.keys[i] = e.id, e.key
	}
	return b, nil
}
