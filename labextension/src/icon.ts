/**
 * The sidebar's tab icon: a memory chip.
 */
import { LabIcon } from '@jupyterlab/ui-components';

import { ICON_NAME } from './constants';

const CHIP_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M6 5h12a1 1 0 0 1 1 1v12a1 1 0 0 1-1 1H6a1 1 0 0 1-1-1V6a1 1 0 0 1 1-1zm1 2v10h10V7H7z"/>
    <rect x="9" y="9" width="6" height="6"/>
    <rect x="8" y="1" width="2" height="3"/><rect x="14" y="1" width="2" height="3"/>
    <rect x="8" y="20" width="2" height="3"/><rect x="14" y="20" width="2" height="3"/>
    <rect x="1" y="8" width="3" height="2"/><rect x="1" y="14" width="3" height="2"/>
    <rect x="20" y="8" width="3" height="2"/><rect x="20" y="14" width="3" height="2"/>
  </g>
</svg>`;

/** Icon of the "GPU Memory" sidebar tab. */
export const gpuMemIcon = new LabIcon({ name: ICON_NAME, svgstr: CHIP_SVG });
