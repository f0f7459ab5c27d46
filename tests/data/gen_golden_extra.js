// Generates tests/data/golden_extra.jsonl with the gpt-3-encoder@1.1.4 reference (EncoderWS.js: its pattern
// with \s spelled as Unicode White_Space). Usage: node gen.js > golden_extra.jsonl
const {encode} = require('./package/EncoderWS.js');
let s = 0x2545F491;
const rnd = () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; };
const pick = a => a[Math.floor(rnd() * a.length)];
const pools = {
  ws: [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '\r', '\x0b', '\x0c', '\x85', '\xa0', '\u1680', '\u2000', '\u2007',
       '\u200a', '\u2028', '\u2029', '\u202f', '\u205f', '\u3000', ' \n', '\t\t ', ' \r\n ', '\u180e', '\u200b',
       '\ufeff', '\x1c', '\x1d', '\x1e', '\x1f'],
  contr: ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'VE", "'M", "'LL", "'lL", "'D",
          "'x", "''", "'", "\u2019s", "n't", "N'T", " 's", "'sa", "'ll've", "''s"],
  word: ['the', 'The', 'THE', 'hello', 'world', 'Hello', 'dont', 'I', 'a', 'encyclopaedia', 'tokenization', 'x',
         'GPT', 'kiln', 'rhythm', 'Zz', 'qwerty', 'isn', 'we', 'you', 'they'],
  digit: () => { let n = 1 + Math.floor(rnd() * 14), r = ''; while (n--) r += String(Math.floor(rnd() * 10)); return r; },
  num: ['3.14', '1,000', '2024-05-20', '0x1F', '1e-9', '-42', '+7', '10%', '$5', '1st', 'v2', '٣٤٥', '१२३', '๓๔',
        'Ⅻ', 'ⅷ', 'ⅰⅱ', '²', '½', '¾', '①', '⑳', '𝟘𝟙', '〇', '一二三', '٠', '߀', '፲'],
  uni: ['é', 'ß', 'Ж', 'жизнь', 'Ελληνικά', '中文', '日本語の', 'カタカナ', '한국어', 'ᄀ', 'ＡＢＣ', 'नमस्ते',
        'हिन्दी', 'ক্ষ', 'العربية', 'עברית', 'ไทย', 'ğüş', 'Ǆ', 'ǅ', 'ﬁ', 'ŉ', 'ᵃ', 'ʰ', 'ª', 'º', 'ℵ', 'ᏣᎳᎩ',
        'ⴰ', 'ꙮ', '𐍈', '𝒜', 'ㄅ', 'ㅏ', 'ὀδυσσεύς'],
  mark: ['e\u0301', 'a\u0308\u0323', '\u0301', '\u0300\u0301', 'n\u0303o', 'ा', '्', 'ं', '\u093f', '\u0e31',
         '\u20dd', '\u0489', 'ç\u0327', '\u05b7', '\u064e', 'i\u0307'],
  emoji: ['😀', '👍', '👍🏽', '👨‍👩‍👧', '🇺🇸', '🏳️‍🌈', '❤️', '❤', '🔥', '🤖', '🧠', '✨', '☃', '⚡', '🫠', '#️⃣', '👩🏾‍💻',
          '\u{1F600}\u{1F600}'],
  ctrl: ['\x00', '\x01', '\x07', '\x08', '\x0e', '\x10', '\x1b', '\x1b[31m', '\x7f', '\x80', '\x9f', '\u0085',
         '\u00ad', '\u200d', '\u200e', '\u202e', '\u2060', '\ue000', '\uf8ff', '\ufffd', '\ufffe', '\u{10ffff}'],
  punct: ['.', ',', '!', '?', ';', ':', '-', '—', '–', '…', '«', '»', '“', '”', '"', '(', ')', '[', ']', '{', '}',
          '<', '>', '@', '#', '$', '%', '^', '&', '*', '_', '+', '=', '|', '\\', '/', '~', '`', '...', '!!!',
          '?!', '--', '->', '::', '´', '¨', '©', '°', '§', '¶', '•', '†', '‰', '€', '£', '¥', '√', '∑', '≠'],
};
const names = Object.keys(pools);
const tok = name => { const p = pools[name]; return typeof p === 'function' ? p() : pick(p); };
const lines = [
  'Hello world', ' Hello world', 'Hello  world', 'Hello world ', 'Hello world  ', '  ', ' ', '\n', '\n\n\n',
  ' \n', '\n ', 'a\r\nb', 'a\r\n\r\nb\r\n', 'line one  \nline two\t\n', "I'm", "I'M", "don't DON'T Don'T",
  "we'll WE'LL we'Ll", "they've THEY'VE", "she'd SHE'D", "it's IT'S It'S", "'s's's", "'''", "rock 'n' roll",
  '12345678901234567890', '3.141592653589793', 'x'.repeat(300), ' '.repeat(40) + 'x', '\t'.repeat(9) + 'y',
  '1'.repeat(250), 'a b  c   d    e', '\u00a0\u00a0word', 'word\u3000\u3000', 'e\u0301e\u0301e\u0301',
  'नमस्ते दुनिया', '١٢٣ ٤٥٦', '👍🏽👍🏽👍🏽', 'emoji 😀 in 😀 text', '\x00\x01\x02', 'tab\tsep\tvalues\t',
  'trailing space ', 'trailing spaces   ', 'CRLF\r\n', 'mixed \r\n\t \x0b\x0c end',
];
for (let i = 0; i < 320; i++) {
  const k = 1 + Math.floor(rnd() * 24);
  let t = '';
  for (let j = 0; j < k; j++) {
    const name = rnd() < 0.3 ? pick(['ws', 'word']) : pick(names);
    if (rnd() < 0.25) t += ' ';
    t += tok(name);
  }
  lines.push(t);
}
for (const text of lines)
  process.stdout.write(JSON.stringify({text, ids: encode(text)}) + '\n');
