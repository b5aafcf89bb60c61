package cli

import (
	"flag"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The flag package's errors name flags with one dash ("invalid value "5" for
// flag -timeout: parse error"). They say "parse error" where the reason
// matters most, as for a duration without its unit. flagError rewrites them
// the way the rest of the CLI writes flags, with the reason.
var (
	invalidValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-(\S+): (.*)$`)
	undefined    = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	needsArg     = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// flagError says what is wrong with a flag of fs, given the error its Parse
// returned.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if m := undefined.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("unknown flag --%s", m[1])
	}
	if m := needsArg.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s needs a value", m[1])
	}
	m := invalidValue.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	value, name, reason := m[1], m[2], m[3]
	f := fs.Lookup(name)
	if f == nil {
		return fmt.Sprintf("--%s %q: %s", name, value, reason)
	}
	getter, _ := f.Value.(flag.Getter)
	var kind any
	if getter != nil {
		kind = getter.Get()
	}
	switch kind.(type) {
	case time.Duration:
		return fmt.Sprintf("--%s %s", name, durationProblem(value))
	case bool:
		return fmt.Sprintf("--%s=%s: want true or false", name, strconv.Quote(value))
	case int, int64, uint, uint64:
		if reason == "value out of range" {
			return fmt.Sprintf("--%s %s: out of range", name, value)
		}
		return fmt.Sprintf("--%s %q: not a whole number", name, value)
	case float64:
		if reason == "value out of range" {
			return fmt.Sprintf("--%s %s: out of range", name, value)
		}
		return fmt.Sprintf("--%s %q: not a number", name, value)
	}
	return fmt.Sprintf("--%s %q: %s", name, value, reason)
}

// durationProblem says what is wrong with value as a duration. Most often it
// is a number without its unit.
func durationProblem(value string) string {
	if _, err := strconv.ParseFloat(value, 64); err == nil {
		return fmt.Sprintf("%s: missing unit; write %[1]ss, %[1]sm or %[1]sh", value)
	}
	_, err := time.ParseDuration(value)
	reason := "not a duration"
	if err != nil && strings.Contains(err.Error(), "unknown unit") {
		reason = "unknown unit"
	}
	return fmt.Sprintf("%q: %s; write a number and a unit, such as 30s, 5m or 1h30m", value, reason)
}
