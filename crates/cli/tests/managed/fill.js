// Builds MIB MiB (about) of small live JS objects, then reads every 7th back: a checksum any
// lost or corrupted page of V8's heap would change. Usage: node fill.js MIB
const mib = +(process.argv[2] || 300);
const arr = [];
for (let i = 0; i < mib * 1024 * 1024 / 64; i++) {
  arr.push({ a: i, b: i * 2, c: 'x' + (i % 1000) });
}
let sum = 0;
for (let i = 0; i < arr.length; i += 7) {
  sum = (sum + arr[i].a * 3 + arr[i].b + arr[i].c.length) % 1000000007;
}
console.log('objects', arr.length, 'checksum', sum);
