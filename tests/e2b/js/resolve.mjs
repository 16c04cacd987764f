// A resolver override for the domain-mode tests, inside this Node process only: with
// E2B_TEST_RESOLVE=<domain>=<ip> every name under the domain resolves to the gateway's address
// (the machine's DNS is never touched). Loaded with `node --import ./resolve.mjs`; fetch
// (undici) and the SDK's Connect transport connect through `dns.lookup`.
import dns from 'node:dns'

const [domain, address] = (process.env.E2B_TEST_RESOLVE ?? '').split('=')
if (domain && address) {
  const lookup = dns.lookup
  dns.lookup = function (host, options, callback) {
    if (typeof options === 'function') {
      callback = options
      options = {}
    }
    if (host === domain || host.endsWith(`.${domain}`)) {
      const family = address.includes(':') ? 6 : 4
      if (options && options.all) return process.nextTick(callback, null, [{ address, family }])
      return process.nextTick(callback, null, address, family)
    }
    return lookup.call(this, host, options, callback)
  }
}
