package idempotency

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// parseKeyHeader returns the key an Idempotency-Key field value carries.
//
// The draft (draft-ietf-httpapi-idempotency-key-header §2.1) makes the field
// an RFC 8941 Item whose value is a String, such as "8e03978e-…" with its
// quotes. Such a value is parsed as RFC 8941 §4.2 says. The String's escapes
// are undone (§4.2.5). Parameters after it are parsed (§4.2.3.2) and ignored,
// since the draft defines none. Anything else fails. The key is the String's value,
// without the quotes. A value that does not start with a quote is the bare form
// Stripe-style clients send (8e03978e-…) and is the key as it is, so "abc"
// quoted and abc bare are the same key.
//
// Either way the key must then be 1 to maxLen visible ASCII characters. It
// has no spaces, though a String may hold them (§2.2 leaves the key's format
// to the server).
func parseKeyHeader(value string, maxLen int) (string, error) {
	// net/http has already removed the field's leading and trailing
	// whitespace. RFC 8941 §4.2 discards leading and trailing SP.
	value = strings.Trim(value, " ")
	key := value
	if strings.HasPrefix(value, `"`) {
		p := &sfParser{s: value}
		var err error
		if key, err = p.parseString(); err != nil {
			return "", err
		}
		if err := p.skipParameters(); err != nil {
			return "", err
		}
		if rest := strings.TrimLeft(p.s, " "); rest != "" {
			return "", fmt.Errorf("unexpected %q after the closing quote: send one quoted String, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\"", rest)
		}
	}
	return key, validateKey(key, maxLen)
}

// sfParser consumes an RFC 8941 (and RFC 9651) field value from the front of s.
type sfParser struct{ s string }

func (p *sfParser) peek() byte {
	if p.s == "" {
		return 0
	}
	return p.s[0]
}

func (p *sfParser) next() byte {
	c := p.s[0]
	p.s = p.s[1:]
	return c
}

// parseString is RFC 8941 §4.2.5, Parsing a String.
func (p *sfParser) parseString() (string, error) {
	if p.peek() != '"' {
		return "", errors.New("a String must start with a double quote")
	}
	p.next()
	var b strings.Builder
	for p.s != "" {
		c := p.next()
		switch {
		case c == '\\':
			if p.s == "" {
				return "", errors.New("the String has no closing quote")
			}
			n := p.next()
			if n != '"' && n != '\\' {
				return "", fmt.Errorf(`the String has the escape \%s: only \" and \\ are escapes`, printable(n))
			}
			b.WriteByte(n)
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("the String holds the byte %s: only printable ASCII (0x20-0x7E) is allowed", printable(c))
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the String has no closing quote")
}

// skipParameters is RFC 8941 §4.2.3.2, Parsing Parameters, keeping nothing.
func (p *sfParser) skipParameters() error {
	for p.peek() == ';' {
		p.next()
		p.s = strings.TrimLeft(p.s, " ")
		// §4.2.3.3, Parsing a Key.
		if c := p.peek(); !isLCAlpha(c) && c != '*' {
			return fmt.Errorf("a parameter name must start with a lowercase letter or '*', not %s", printable(c))
		}
		for c := p.peek(); isLCAlpha(c) || isDigit(c) || strings.IndexByte("_-.*", c) >= 0; c = p.peek() {
			p.next()
		}
		if p.peek() == '=' {
			p.next()
			if err := p.skipBareItem(); err != nil {
				return fmt.Errorf("parameter value: %w", err)
			}
		}
	}
	return nil
}

// skipBareItem is RFC 8941 §4.2.3.1, Parsing a Bare Item, with RFC 9651's Date
// and Display String.
func (p *sfParser) skipBareItem() error {
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.skipNumber()
	case c == '"':
		_, err := p.parseString()
		return err
	case isAlpha(c) || c == '*': // §4.2.6, Token
		p.next()
		for c := p.peek(); isTChar(c) || c == ':' || c == '/'; c = p.peek() {
			p.next()
		}
		return nil
	case c == ':': // §4.2.7, Byte Sequence
		p.next()
		end := strings.IndexByte(p.s, ':')
		if end < 0 {
			return errors.New("a Byte Sequence has no closing ':'")
		}
		for i := range end {
			if c := p.s[i]; !isAlpha(c) && !isDigit(c) && c != '+' && c != '/' && c != '=' {
				return fmt.Errorf("a Byte Sequence holds %s, which is not base64", printable(c))
			}
		}
		p.s = p.s[end+1:]
		return nil
	case c == '?': // §4.2.8, Boolean
		p.next()
		if c := p.peek(); c != '0' && c != '1' {
			return errors.New("a Boolean is ?0 or ?1")
		}
		p.next()
		return nil
	case c == '@': // RFC 9651 §4.2.9, Date
		p.next()
		return p.skipNumber()
	case c == '%': // RFC 9651 §4.2.10, Display String
		return p.skipDisplayString()
	default:
		return fmt.Errorf("no value starts with %s", printable(c))
	}
}

// skipNumber is RFC 8941 §4.2.4, Parsing an Integer or Decimal.
func (p *sfParser) skipNumber() error {
	if p.peek() == '-' {
		p.next()
	}
	if !isDigit(p.peek()) {
		return errors.New("a number must have a digit after its sign")
	}
	n, dot := 0, -1
	for c := p.peek(); isDigit(c) || c == '.' && dot < 0; c = p.peek() {
		if c == '.' {
			if n > 12 {
				return errors.New("a Decimal has at most 12 digits before its point")
			}
			dot = n
		}
		p.next()
		n++
		if dot < 0 && n > 15 || n > 16 {
			return errors.New("the number is too long")
		}
	}
	if dot >= 0 && (n-dot-1 < 1 || n-dot-1 > 3) {
		return errors.New("a Decimal has 1 to 3 digits after its point")
	}
	return nil
}

// skipDisplayString is RFC 9651 §4.2.10, Parsing a Display String.
func (p *sfParser) skipDisplayString() error {
	if !strings.HasPrefix(p.s, `%"`) {
		return errors.New(`a Display String starts with %"`)
	}
	p.s = p.s[2:]
	var b []byte
	for p.s != "" {
		c := p.next()
		switch {
		case c == '%':
			if len(p.s) < 2 || !isLCHex(p.s[0]) || !isLCHex(p.s[1]) {
				return errors.New("a Display String's % is followed by two lowercase hex digits")
			}
			b = append(b, unhex(p.s[0])<<4|unhex(p.s[1]))
			p.s = p.s[2:]
		case c == '"':
			if !utf8.Valid(b) {
				return errors.New("a Display String must decode to UTF-8")
			}
			return nil
		case c < 0x20 || c > 0x7e:
			return fmt.Errorf("a Display String holds the byte %s", printable(c))
		default:
			b = append(b, c)
		}
	}
	return errors.New("a Display String has no closing quote")
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isLCHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' }

func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func unhex(c byte) byte {
	if isDigit(c) {
		return c - '0'
	}
	return c - 'a' + 10
}

// printable names byte c for an error message a client will read.
func printable(c byte) string {
	if c > 0x20 && c < 0x7f {
		return fmt.Sprintf("'%c'", c)
	}
	return fmt.Sprintf("0x%02X", c)
}
