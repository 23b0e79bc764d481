/**
 * The sidebar's calls to the server extension (docs/PROTOCOL.md, "Server
 * extension"): every HTTP request it makes goes through here, on the
 * server's authenticated ServerConnection. Their answers' types and checks
 * are in protocol.ts.
 */
import { ServerConnection } from '@jupyterlab/services';

import { IOrphanPurge, IServerKernels, parseServerKernels } from './protocol';

/** Every kernel of the server, its host and GPU memory, and the other GPU processes. */
export const KERNELS_PATH = 'api/gpumem/kernels';

/** `%gpumem purge --orphans`, run by the server (`{"dry_run": bool}`). */
export const ORPHANS_PATH = 'api/gpumem/orphans';

/**
 * GET (no body) or POST (a JSON body) a path under the server's base URL;
 * the answer's JSON. Throws on an HTTP error.
 */
export type ServerRequest = (path: string, body?: unknown) => Promise<unknown>;

/** The request of the server these settings name. */
export function serverRequest(
  settings: ServerConnection.ISettings
): ServerRequest {
  return async (path: string, body?: unknown): Promise<unknown> => {
    const base = settings.baseUrl;
    const url = (base.endsWith('/') ? base : base + '/') + path;
    const init: RequestInit =
      body === undefined
        ? { method: 'GET' }
        : { method: 'POST', body: JSON.stringify(body) };
    const response = await ServerConnection.makeRequest(url, init, settings);
    if (!response.ok) {
      throw new ServerConnection.ResponseError(response);
    }
    return response.json();
  };
}

/** `GET api/gpumem/kernels`, checked; throws on anything else. */
export async function readServerKernels(
  request: ServerRequest
): Promise<IServerKernels> {
  return parseServerKernels(await request(KERNELS_PATH));
}

/** `POST api/gpumem/orphans`: end (or, with `dryRun`, list) the orphans. */
export async function endServerOrphans(
  request: ServerRequest,
  dryRun: boolean
): Promise<IOrphanPurge> {
  return (await request(ORPHANS_PATH, { dry_run: dryRun })) as IOrphanPurge;
}
